//! What the machine had when a test failed: free disk where the build and the tests write,
//! and the load. A CI log that shows a full disk or a saturated machine beside a failure
//! says why the failure came (a full disk once failed 11 test binaries at random).

use std::path::Path;
use std::process::Command;

/// Free space under `target/` and the temp dir (where every etcd of the tests keeps its
/// data, 64 MiB of preallocated WAL each) and `/proc/loadavg`, on one line.
pub(crate) fn state(target: &Path) -> String {
    let tmp = std::env::temp_dir();
    let mut parts = Vec::new();
    for (what, dir) in [("target", target), ("temp", tmp.as_path())] {
        match free_bytes(dir) {
            Some(b) => parts.push(format!(
                "{what} ({}) {:.1} GiB free",
                dir.display(),
                b as f64 / (1u64 << 30) as f64
            )),
            None => parts.push(format!("{what} ({}) free space unknown", dir.display())),
        }
    }
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        parts.push(format!("load {}", load.join(" ")));
    }
    parts.join(", ")
}

/// Free bytes of the file system holding `dir`, from POSIX `df -Pk` (no libc binding).
fn free_bytes(dir: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(dir).output().ok()?;
    if !out.status.success() {
        return None;
    }
    parse_df(&String::from_utf8_lossy(&out.stdout))
}

/// The "Available" column (KiB) of `df -Pk`'s second line, in bytes.
fn parse_df(text: &str) -> Option<u64> {
    let line = text.lines().nth(1)?;
    let kib: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn df_output_gives_the_available_bytes() {
        let text = "Filesystem     1024-blocks     Used Available Capacity Mounted on\n\
                    /dev/vda         263174212 59000000  36700160      62% /\n";
        assert_eq!(parse_df(text), Some(36_700_160 * 1024));
        assert_eq!(parse_df("Filesystem\n"), None);
        assert_eq!(parse_df(""), None);
    }

    #[test]
    fn the_state_names_both_places_and_the_load() {
        let s = state(Path::new("."));
        assert!(s.contains("target (.)"), "{s}");
        assert!(s.contains("temp ("), "{s}");
    }
}
