//! The README's and the guides' code, held to what CI compiles.
//!
//! Invariant: every Rust block of README.md and docs/*.md is compiled: a doctest (the
//! README and the guides are doctests of `idemcache` or of `idemcache-integration`), or a
//! quote of lines from a file CI builds and runs. A quote is a fenced block right after a
//! line `<!-- quote: PATH#NAME -->`; it must equal, line for line, the lines of PATH
//! (from the repository's root) between `ANCHOR: NAME` and `ANCHOR_END: NAME`, less their
//! common indentation and any other anchor's marker lines. A Rust block marked `ignore`
//! that is not a quote fails here.

use std::path::{Path, PathBuf};

const QUOTE: &str = "<!-- quote: ";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files checked: the README and every guide.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    guides.sort();
    files.extend(guides);
    files
}

/// A fenced block: its info string, its lines, the line (1-based) of its opening fence,
/// and the quote marker on the line before it, if any.
struct Block {
    info: String,
    lines: Vec<String>,
    line: usize,
    quote: Option<String>,
}

fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let quote = i
            .checked_sub(1)
            .and_then(|before| lines[before].trim().strip_prefix(QUOTE))
            .and_then(|rest| rest.strip_suffix("-->"))
            .map(|target| target.trim().to_owned());
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            body.push(lines[i].to_owned());
            i += 1;
        }
        found.push(Block { info: info.trim().to_owned(), lines: body, line: start + 1, quote });
        i += 1;
    }
    found
}

/// The lines of `file` between `ANCHOR: name` and `ANCHOR_END: name`, less their common
/// indentation and any other anchor's markers.
fn anchored(file: &Path, name: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let is_marker = |line: &str, marker: &str| {
        line.split_once(marker).is_some_and(|(_, rest)| rest.trim() == name)
    };
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|line| is_marker(line, "ANCHOR: "))
        .ok_or_else(|| format!("{} has no `ANCHOR: {name}`", file.display()))?;
    let mut taken = Vec::new();
    let mut closed = false;
    for line in lines {
        if is_marker(line, "ANCHOR_END: ") {
            closed = true;
            break;
        }
        if !line.contains("ANCHOR: ") && !line.contains("ANCHOR_END: ") {
            taken.push(line);
        }
    }
    if !closed {
        return Err(format!("{} has no `ANCHOR_END: {name}`", file.display()));
    }
    let indent = taken
        .iter()
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.len() - line.trim_start().len())
        .min()
        .unwrap_or(0);
    Ok(taken.iter().map(|line| line.get(indent..).unwrap_or("").to_owned()).collect())
}

#[test]
fn every_rust_block_is_compiled_and_every_quote_matches_its_source() {
    let mut problems = Vec::new();
    for document in documents() {
        let text = std::fs::read_to_string(&document).expect("a readable document");
        let shown = document.strip_prefix(root()).unwrap_or(&document).display().to_string();
        for block in blocks(&text) {
            let at = format!("{shown}:{}", block.line);
            let Some(target) = &block.quote else {
                let rust = block.info.split(',').next() == Some("rust");
                if rust && block.info.split(',').any(|word| word == "ignore") {
                    problems.push(format!(
                        "{at}: a Rust block marked `ignore` that quotes nothing: make it a \
                         doctest, or quote a compiled example (`{QUOTE}PATH#NAME -->`)"
                    ));
                }
                continue;
            };
            let Some((path, name)) = target.split_once('#') else {
                problems.push(format!("{at}: the quote {target:?} is not PATH#NAME"));
                continue;
            };
            match anchored(&root().join(path), name) {
                Ok(expected) if expected == block.lines => {}
                Ok(expected) => problems.push(format!(
                    "{at}: the block differs from {path}, anchor {name}; it should read:\n{}",
                    expected.join("\n")
                )),
                Err(e) => problems.push(format!("{at}: {e}")),
            }
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n\n"));
}

#[test]
fn a_quote_is_the_anchored_lines_dedented_without_other_markers() {
    let dir = std::env::temp_dir().join(format!("idemcache-quoted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let file = dir.join("example.rs");
    std::fs::write(
        &file,
        "fn main() {\n    // ANCHOR: body\n    let a = 1;\n    // ANCHOR: inner\n\n        \
         nested();\n    // ANCHOR_END: inner\n    // ANCHOR_END: body\n}\n",
    )
    .expect("written");
    let body = anchored(&file, "body").expect("the body anchor");
    assert_eq!(body, ["let a = 1;", "", "    nested();"]);
    assert!(anchored(&file, "bod").is_err(), "a name is matched whole");
    assert!(anchored(&file, "missing").is_err());
    let _ = std::fs::remove_dir_all(&dir);

    let markdown = "text\n<!-- quote: a.rs#x -->\n```rust,ignore\nline\n```\n```sh\nls\n```\n";
    let found = blocks(markdown);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].quote.as_deref(), Some("a.rs#x"));
    assert_eq!(
        (found[0].info.as_str(), found[0].lines.as_slice()),
        ("rust,ignore", &["line".to_owned()][..])
    );
    assert_eq!((found[1].quote.as_deref(), found[1].line), (None, 6));
}
