//! `idem`: runs a command at most once per key, across processes and runs; a repeat
//! replays the recorded exit status, stdout and stderr without running it.
//!
//! Invariant: the process's exit code is CMD's own (or 128+N for a CMD killed by
//! signal N) or one of [`exit`]'s documented codes, and every failure is reported on
//! stderr as `idem: <what failed and why>`. Nothing is printed but through [`output`],
//! which never panics (a closed pipe, `idem list | head`) nor changes that code.

mod admin;
mod child;
mod db;
mod duration;
mod exit;
mod netfs;
mod outcome;
mod output;
mod run;
mod settings;
mod signals;
mod target;
mod timefmt;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const ABOUT: &str =
    "Run a command at most once per key: repeats replay its recorded exit status and output";

const LONG_ABOUT: &str = "\
Run a command at most once per key, across processes and runs.

The first `idem run --key K -- CMD ARGS...` runs CMD and records its exit status, stdout
and stderr (byte for byte, up to 4 MiB together) in a SQLite database; every repeat of K
replays them without running CMD. Runs of K at the same time wait for the first and
replay it. A run interrupted (Ctrl-C, SIGTERM) or killed while CMD runs leaves K UNKNOWN:
nobody knows whether CMD had its effect, so K is not run again until you say so.";

const AFTER_HELP: &str = "\
Examples:
  idem run --key deploy-2026-12-01 -- ./deploy.sh --prod
  idem status deploy-2026-12-01
  idem list --unknown --json

From cron, two crontab lines (exit 75 at once if the last run is still going):
  IDEM_DB=/home/al/.local/state/idem/idem.db
  0 3 * * * /usr/local/bin/idem run --key nightly-$(date +\\%F) --no-wait -- /srv/bin/backup
In a crontab a `%` not written `\\%` ends the command (the job fails with a shell syntax
error and never runs). Cron's environment (HOME, XDG_STATE_HOME) and working directory
are not your shell's: set IDEM_DB, or cron's runs and yours use two databases, and give
CMD by its absolute path (`./backup` and `/srv/bin/backup` are two commands: exit 65).

The state database: --db PATH, else $IDEM_DB, else $XDG_STATE_HOME/idem/idem.db, else
~/.local/state/idem/idem.db (its directory created mode 0700). It must be on a local
disk: a database on NFS, SMB/CIFS or a FUSE network filesystem is refused (SQLite's WAL
and locks do not work there).

Leases: a run holds K for 10 s, renewed every ~3.3 s while CMD runs, so a long command
is never taken over. A run killed with SIGKILL leaves K in progress for at most 10 s,
then UNKNOWN. So does a run suspended (Ctrl-Z, SIGSTOP) for longer than the lease:
resumed, it does not record CMD's outcome (and says so).

Environment for tuning and tests, each a whole number (another value is exit 64):
IDEM_LEASE_MS (the lease, default 10000, from 300 to 3153600000000),
IDEM_BUSY_TIMEOUT_MS (how long to wait for another process's lock on the database,
default 5000, from 0 to 2147483647), IDEM_MAX_OUTPUT (bytes of output kept, default
4194304, from 0 to 536870912).
";

#[derive(Debug, Parser)]
#[command(name = "idem", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    /// The state database (default: $XDG_STATE_HOME/idem/idem.db or ~/.local/state/idem/idem.db).
    #[arg(long, global = true, value_name = "PATH", env = "IDEM_DB", hide_env_values = true)]
    db: Option<PathBuf>,

    /// Print JSON for scripts (status, forget, resolve, list, gc).
    #[arg(long, global = true)]
    json: bool,

    /// Act on a service's idemcache store instead of idem's database (status, list,
    /// resolve, forget, gc): postgres://..., redis://..., redis-cluster://host:port,...,
    /// mysql://..., sqlite:PATH. Its password is never printed.
    #[arg(long, global = true, value_name = "URL", env = "IDEM_STORE", hide_env_values = true)]
    store: Option<String>,

    /// With --store: read a lapsed lease as the service's LapsePolicy::MarkUnknown { ttl }
    /// does, UNKNOWN for this long after it lapsed (default: as TakeOver, absent).
    #[arg(long, global = true, value_parser = duration::parse_ttl, value_name = "DURATION")]
    unknown_ttl: Option<Duration>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD at most once per key; a repeat replays its exit status and output.
    #[command(after_help = "\
Examples:
  idem run --key invoice-42 -- ./send-invoice 42
      runs once; every repeat prints the same output and exits with the same status
  idem run --key db-migrate-v7 --wait 600 -- ./migrate up
      a second run at the same time waits up to 10 min for the first, then replays it
  0 3 * * * /usr/local/bin/idem run --key nightly-$(date +\\%F) --no-wait -- /srv/bin/backup
      a crontab line: exits 75 at once if another run of the key is in progress. In a
      crontab, write `%` as `\\%`, set IDEM_DB=... on a line above (cron's HOME is not
      always yours: two databases), and give CMD by its absolute path (cron's working
      directory is not yours; `./backup` and `/srv/bin/backup` are two commands, exit 65)
  idem run --key invoice-42 --retry-unknown -- ./send-invoice 42
      after an interrupted run (exit 79, UNKNOWN), and after checking: run it again

The command is CMD and its arguments, exactly: the same key with another command
exits 65. CMD's stdin is passed through; its stdout and stderr are passed through as
they come and recorded (4 MiB together at most: past that, only the status is kept).
Ctrl-C, SIGTERM or SIGHUP is passed to CMD and leaves the key UNKNOWN (exit 79 on the
next run), as does CMD dying of one of those; CMD killed by another signal N is recorded,
and replayed as exit 128+N.")]
    Run(RunArgs),

    /// Show a key's record: its state, its command, its outcome, its times.
    #[command(after_help = "\
Examples:
  idem status invoice-42
  idem status invoice-42 --json | jq -r .state      # ABSENT, PROCESSING, COMPLETED or UNKNOWN
  idem status --store postgres://ops@db/shop --scope 'POST /v1/orders' --tenant user:42 8e03978e

Exits 0 whenever it could tell (the state is in its output).")]
    Status {
        /// The key (the client's key, with --scope and --tenant for a service's record).
        key: String,
        #[command(flatten)]
        at: target::Address,
    },

    /// Forget an UNKNOWN outcome (after checking it did not happen), so the next run executes.
    #[command(after_help = "\
Examples:
  idem forget invoice-42             # it was UNKNOWN and the invoice was not sent
  idem forget invoice-42 --force     # clear a record stuck PROCESSING, or a COMPLETED one

Exits 1 when the key has no record in a state it clears.")]
    Forget {
        /// The key.
        key: String,
        #[command(flatten)]
        at: target::Address,
        /// Also clear a PROCESSING record (a run stuck holding it: its outcome will not
        /// be recorded, and the key may run again while it still runs) or a COMPLETED one.
        #[arg(long)]
        force: bool,
    },

    /// Record an UNKNOWN key's outcome by hand (after checking it happened): repeats exit N.
    #[command(after_help = "\
Examples:
  idem resolve invoice-42 --exit-code 0    # it was UNKNOWN; the invoice did go out

Repeats then exit N without running and print nothing. Exits 1 when the key is not UNKNOWN.")]
    Resolve {
        /// The key.
        key: String,
        #[command(flatten)]
        at: target::Address,
        /// The exit status repeats replay.
        #[arg(long, value_name = "N")]
        exit_code: u8,
        /// How long the resolved outcome is kept.
        #[arg(long, default_value = "24h", value_parser = duration::parse_ttl, value_name = "DURATION")]
        ttl: Duration,
    },

    /// List the live records (every state), oldest first, or with --unknown those awaiting a decision.
    #[command(after_help = "\
Examples:
  idem list
  idem list --unknown                 # interrupted or killed runs: check each, resolve or forget
  idem list --unknown --json | jq -r '.[].key'
  idem list --store redis://cache:6379 --key 8e03978e --json
      every record of a service whose client key is 8e03978e, whatever its scope and tenant

Without --scope or --tenant it lists every scope and tenant. A listing reads the whole
store (a store lists in key order; idem prints the oldest): on a big store, narrow it
with --scope, whose records a SQL store reads as one range of keys.")]
    List {
        /// Only UNKNOWN records.
        #[arg(long)]
        unknown: bool,
        /// Only PROCESSING records (with --unknown: both).
        #[arg(long)]
        in_progress: bool,
        /// Only records of this client key (what the customer sent), whatever their scope
        /// and tenant unless those are given too.
        #[arg(long, value_name = "CLIENT_KEY")]
        key: Option<String>,
        #[command(flatten)]
        at: target::Address,
        /// Print at most this many records (the oldest).
        #[arg(long, default_value = "1000", value_name = "N")]
        limit: usize,
    },

    /// Delete expired records (their TTL passed); UNKNOWN ones are kept until theirs does.
    #[command(
        visible_alias = "purge",
        after_help = "\
Examples:
  idem gc                              # e.g. daily from cron; runs never need it to be correct"
    )]
    Gc,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The key: what makes two runs "the same" (1-255 visible ASCII characters).
    #[arg(long, value_name = "K")]
    key: String,

    /// How long the outcome is kept: 24h, 90m, 30s, 7d, 1h30m. (An interrupted or killed run stays UNKNOWN for a year, until resolved or forgotten.)
    #[arg(long, default_value = "24h", value_parser = duration::parse_ttl, value_name = "DURATION")]
    ttl: Duration,

    /// How long to wait for a run of the same key in progress elsewhere, then replay it.
    #[arg(long, default_value = "60", value_parser = duration::parse_wait, value_name = "SECS", conflicts_with = "no_wait")]
    wait: Duration,

    /// Do not wait for a run in progress: exit 75 at once.
    #[arg(long)]
    no_wait: bool,

    /// If the key is UNKNOWN (an interrupted run), forget that and run CMD.
    #[arg(long)]
    retry_unknown: bool,

    /// CMD and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let help = format!("{AFTER_HELP}\n{}", exit::TABLE);
    let command = <Cli as clap::CommandFactory>::command().after_help(help);
    let cli = match command
        .try_get_matches()
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            output::errln!("idem: {failure}");
            ExitCode::from(failure.code)
        }
    }
}

/// How long a killed run's lapsed lease stays UNKNOWN, for every subcommand alike (a
/// run, whatever its `--ttl`, `status`, `list`, `gc`): long, and the same everywhere, so
/// that no reader's setting lets a later run execute a command whose effect may have
/// happened. `idem resolve` or `idem forget` settles it sooner.
const LAPSE_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

fn dispatch(cli: Cli) -> Result<u8, exit::Failure> {
    // A bad key is a usage error (64) whatever state the database is in: checked first.
    match &cli.command {
        Command::Run(RunArgs { key, .. }) => drop(run::key(key)?),
        Command::Status { key, at }
        | Command::Forget { key, at, .. }
        | Command::Resolve { key, at, .. } => drop(at.key(key)?),
        // A client key no record can have (empty, a space, too long: a value pasted
        // wrong) would list nothing, read as "no record of it": refused as status
        // refuses it. Only the client key's rules: any scope and tenant may hold it.
        Command::List { key: Some(key), .. } => drop(target::Address::default().key(key)?),
        Command::List { .. } | Command::Gc => {}
    }
    let settings = settings::Settings::from_env()?;
    let (store, unknown_ttl, db) = (cli.store, cli.unknown_ttl, cli.db);
    // Where the admin subcommands act: a service's store (--store), else idem's own. An
    // empty one (`--store "$STORE"` with the variable unset) names no store: read as
    // idem's own, it answered "no record" about a database nobody asked about.
    let open = || match store.as_deref() {
        Some("") => Err(exit::Failure::new(
            exit::USAGE,
            "--store (or IDEM_STORE) is empty: give the service's store URL, or leave it out \
             to act on idem's own database",
        )),
        Some(url) => target::Target::remote(url, target::lapse_policy(unknown_ttl)),
        None => target::Target::local(db::open(
            db::path(db.clone())?,
            LAPSE_WINDOW,
            settings.busy_timeout,
        )?),
    };
    match cli.command {
        Command::Run(args) => {
            if store.is_some() {
                return Err(exit::Failure::new(
                    exit::USAGE,
                    "idem run keeps its records in idem's own database (--db): --store is for \
                     status, list, resolve, forget and gc",
                ));
            }
            let db = db::open(db::path(db.clone())?, LAPSE_WINDOW, settings.busy_timeout)?;
            let wait = if args.no_wait { Duration::ZERO } else { args.wait };
            let run = run::Run {
                key: args.key,
                argv: args.command,
                ttl: args.ttl,
                unknown_ttl: LAPSE_WINDOW,
                wait,
                retry_unknown: args.retry_unknown,
                lease: settings.lease,
                max_output: settings.max_output,
            };
            run::run(&db, run)
        }
        Command::Status { key, at } => admin::status(&open()?, &at.key(&key)?, cli.json),
        Command::Forget { key, at, force } => {
            admin::forget(&open()?, &at.key(&key)?, force, cli.json)
        }
        Command::Resolve { key, at, exit_code, ttl } => {
            admin::resolve(&open()?, &at.key(&key)?, exit_code, ttl, cli.json)
        }
        Command::List { unknown, in_progress, key, at, limit } => {
            let mut filter = idemcache::store::RecordFilter::new();
            if unknown {
                filter = filter.state(idemcache::store::RecordState::Unknown);
            }
            if in_progress {
                filter = filter.state(idemcache::store::RecordState::Processing);
            }
            if let Some(scope) = at.scope {
                filter = filter.scope(scope);
            }
            if let Some(tenant) = at.tenant {
                filter = filter.tenant(tenant);
            }
            if let Some(client_key) = key {
                filter = filter.client_key(client_key);
            }
            admin::list(&open()?, &admin::Listing { filter, limit }, cli.json)
        }
        Command::Gc => admin::gc(&open()?, cli.json),
    }
}
