//! Refusing a state database on a network filesystem: SQLite's WAL needs shared memory
//! between the processes using a file, and its locks are advisory locks that NFS, SMB
//! and FUSE filesystems break or ignore, so two hosts (or two processes) could both
//! claim one key.
//!
//! Invariant: the filesystem judged is the one holding the file SQLite opens: the
//! database's path with every symlink resolved (a link on a local disk into an NFS mount
//! is on NFS), or, while the file does not exist yet, the resolved path of where it will
//! be made. It is the one mounted at the longest mount point that contains that path
//! (the last such mount, as later mounts hide earlier ones), read from
//! `/proc/self/mountinfo`; where that file cannot be read (not Linux), nothing is
//! refused.

use std::path::{Path, PathBuf};

/// Filesystem types whose locking SQLite cannot rely on.
const NETWORK: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "ncpfs",
    "afs",
    "9p",
    "ceph",
    "glusterfs",
    "lustre",
    "gpfs",
    "davfs",
    "coda",
    "fuse.sshfs",
    "fuse.rclone",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.glusterfs",
    "fuse.davfs2",
    "fuse.juicefs",
    "fuse.cephfs",
    "fuse.goofys",
    "fuse.smbnetfs",
    "fuse.curlftpfs",
];

/// How many symlinks are followed to the database file (Linux's own limit).
const MAX_LINKS: usize = 40;

/// The network filesystem the database file `db` is on, as `(type, mount point)`, or
/// `None`.
pub fn network_filesystem(db: &Path) -> Option<(String, String)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    judge(db, |path| mount_of(&mountinfo, path))
}

/// The network filesystem `db` is on, where `mount` gives the mount point and type
/// of the mount holding an absolute, resolved path.
fn judge(db: &Path, mount: impl Fn(&str) -> Option<(String, String)>) -> Option<(String, String)> {
    let (point, fstype) = mount(resolved(db)?.to_str()?)?;
    NETWORK.contains(&fstype.as_str()).then_some((fstype, point))
}

/// Where the file `db` is, or will be made: its canonical path if it exists; else,
/// after following any symlinks (SQLite makes the file where a link points), its
/// directory's canonical path and its name.
fn resolved(db: &Path) -> Option<PathBuf> {
    let mut path = db.to_path_buf();
    for _ in 0..MAX_LINKS {
        if let Ok(file) = std::fs::canonicalize(&path) {
            return Some(file);
        }
        let Ok(target) = std::fs::read_link(&path) else { break };
        // A relative target is relative to the link's directory.
        path = path.parent().map_or_else(|| target.clone(), |dir| dir.join(&target));
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(dir).ok()?.join(path.file_name()?))
}

/// The mount point and filesystem type of the mount holding the absolute path `path`.
fn mount_of(mountinfo: &str, path: &str) -> Option<(String, String)> {
    let mut best: Option<(String, String)> = None;
    for line in mountinfo.lines() {
        // `36 35 98:0 /root /mnt/point rw,noatime shared:1 - ext4 /dev/sda1 rw`: the
        // mount point is the fifth field, the type follows the " - " separator.
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else { continue };
        let (Some(point), Some(fstype)) = (fields.get(4), fields.get(sep + 1)) else { continue };
        let point = unescape(point);
        let inside = path == point
            || point == "/"
            || path.strip_prefix(point.as_str()).is_some_and(|rest| rest.starts_with('/'));
        if inside && best.as_ref().is_none_or(|(b, _)| point.len() >= b.len()) {
            best = Some((point, (*fstype).to_owned()));
        }
    }
    best
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let v = (d[0] - b'0') as u32 * 64 + (d[1] - b'0') as u32 * 8 + (d[2] - b'0') as u32;
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:2 - ext4 /dev/sda2 rw
41 40 0:36 / /home/al/net rw,relatime shared:3 - nfs4 server:/export rw
42 40 0:37 / /home/al/my\\040share rw - cifs //nas/share rw
43 22 0:38 / /mnt/ssh rw - fuse.sshfs al@host:/ rw
44 41 0:39 / /home/al/net/local rw - tmpfs tmpfs rw
45 22 0:40 / /home rw - xfs /dev/sdb1 rw";

    #[test]
    fn the_longest_containing_mount_decides() {
        let at = |p| mount_of(MOUNTINFO, p).map(|(_, t)| t);
        assert_eq!(at("/home/al/net/x/idem.db").as_deref(), Some("nfs4"));
        assert_eq!(at("/home/al/net").as_deref(), Some("nfs4"));
        assert_eq!(
            at("/home/al/network/x").as_deref(),
            Some("xfs"),
            "a name prefix is not a path prefix"
        );
        assert_eq!(at("/home/al/net/local/d").as_deref(), Some("tmpfs"));
        assert_eq!(at("/home/al/my share/d").as_deref(), Some("cifs"), "escapes undone");
        assert_eq!(at("/mnt/ssh/state").as_deref(), Some("fuse.sshfs"));
        assert_eq!(at("/var/lib").as_deref(), Some("ext4"));
        assert_eq!(
            at("/home/bo").as_deref(),
            Some("xfs"),
            "a later mount on one point hides the earlier"
        );
        for network in ["nfs4", "cifs", "fuse.sshfs"] {
            assert!(NETWORK.contains(&network));
        }
        assert!(!NETWORK.contains(&"ext4") && !NETWORK.contains(&"tmpfs"));
    }

    /// A database whose path leads, through symlinks, into an NFS mount is judged by
    /// where it leads, not by where the link is (the link's directory is local). The
    /// mounts are made up: the `remote` directory is an NFS mount in them.
    #[test]
    fn a_symlink_into_a_network_mount_is_judged_where_it_leads() {
        use std::os::unix::fs::symlink;
        let root = std::env::temp_dir().join(format!("idem-netfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (local, remote) = (root.join("local"), root.join("remote"));
        std::fs::create_dir_all(&local).unwrap();
        std::fs::create_dir_all(&remote).unwrap();
        let remote_dir = std::fs::canonicalize(&remote).unwrap();
        let mountinfo = format!(
            "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n41 22 0:36 / {} rw - nfs4 server:/x rw",
            remote_dir.display()
        );
        let at = |db: &Path| judge(db, |p| mount_of(&mountinfo, p)).map(|(t, _)| t);
        std::fs::write(remote.join("idem.db"), "").unwrap();
        symlink(remote.join("idem.db"), local.join("link.db")).unwrap();
        symlink("../remote/idem.db", local.join("relative.db")).unwrap();
        symlink("link.db", local.join("chain.db")).unwrap();
        symlink(remote.join("not-yet.db"), local.join("dangling.db")).unwrap();
        symlink(&remote, local.join("state")).unwrap();
        for db in ["link.db", "relative.db", "chain.db", "dangling.db", "state/new.db"] {
            assert_eq!(at(&local.join(db)).as_deref(), Some("nfs4"), "{db}");
        }
        assert_eq!(at(&remote.join("new.db")).as_deref(), Some("nfs4"), "not made yet");
        std::fs::write(local.join("plain.db"), "").unwrap();
        assert_eq!(at(&local.join("plain.db")), None, "a local file");
        assert_eq!(at(&local.join("new.db")), None, "a local file not made yet");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn this_machines_temp_dir_is_judged_without_error() {
        // Whatever it is, judging it must not panic; on Linux the lookup finds a mount.
        let _ = network_filesystem(&std::env::temp_dir());
        if cfg!(target_os = "linux") {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(mount_of(&info, "/").is_some());
        }
    }
}
