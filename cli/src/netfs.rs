//! Refusing a state database on a network filesystem: SQLite's WAL needs shared memory
//! between the processes using a file, and its locks are advisory locks that NFS, SMB
//! and FUSE filesystems break or ignore, so two hosts (or two processes) could both
//! claim one key.
//!
//! Invariant: the filesystem judged is the one mounted at the longest mount point that
//! contains the database's directory (the last such mount, as later mounts hide earlier
//! ones), read from `/proc/self/mountinfo`; where that file cannot be read (not Linux),
//! nothing is refused.

use std::path::Path;

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

/// The network filesystem `dir` is on, as `(type, mount point)`, or `None`.
pub fn network_filesystem(dir: &Path) -> Option<(String, String)> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let dir = std::fs::canonicalize(dir).ok()?;
    let (point, fstype) = mount_of(&mountinfo, dir.to_str()?)?;
    NETWORK.contains(&fstype.as_str()).then_some((fstype, point))
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
