//! `cargo xtask prereqs`: the system packages the build and the tests need, checked and (as
//! root) installed with apt.
//!
//! | what                                   | found as                                                   | Debian package      |
//! |----------------------------------------|------------------------------------------------------------|---------------------|
//! | `etcd` 3.4 (the default test server)   | `$ETCD_BIN`, else `etcd` on `PATH`                         | `etcd-server`       |
//! | `etcdctl` 3.4                          | `$ETCDCTL_BIN`, else `etcdctl` on `PATH`                   | `etcd-client`       |
//! | `protoc` (etcd-client's build)         | `$PROTOC`, else `protoc` on `PATH`                         | `protobuf-compiler` |
//! | the well-known protos (`google/protobuf/descriptor.proto`, …) | `$PROTOC_INCLUDE`, else where protoc itself looks: `<protoc dir>/include`, `<protoc dir>/../include` (`/usr/include` for `/usr/bin/protoc`) | `libprotobuf-dev` |
//!
//! Without the well-known protos etcd-client's build fails with
//! `google/protobuf/descriptor.proto: File not found`.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{is_root, run};

/// One thing the build or the tests need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prereq {
    /// What it is, for messages.
    pub what: &'static str,
    /// The Debian package that provides it.
    pub package: &'static str,
    /// Where it was found, or why not.
    pub found: Result<PathBuf, String>,
    /// Whether a command fails without it (etcdctl is only needed by tests that ask for it).
    pub required: bool,
}

/// What the checks read from the environment and the file system, apart for testing.
#[derive(Debug, Clone)]
pub struct Probe {
    pub etcd_bin: Option<OsString>,
    pub etcdctl_bin: Option<OsString>,
    pub protoc: Option<OsString>,
    pub protoc_include: Option<OsString>,
    pub path: Option<OsString>,
}

impl Probe {
    pub fn from_env() -> Probe {
        Probe {
            etcd_bin: env::var_os("ETCD_BIN"),
            etcdctl_bin: env::var_os("ETCDCTL_BIN"),
            protoc: env::var_os("PROTOC"),
            protoc_include: env::var_os("PROTOC_INCLUDE"),
            path: env::var_os("PATH"),
        }
    }

    fn on_path(&self, name: &str) -> Option<PathBuf> {
        let path = self.path.as_ref()?;
        env::split_paths(path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    }

    /// `$var` when set (it must be a file), else `name` on PATH.
    fn binary(&self, var: &str, value: &Option<OsString>, name: &str) -> Result<PathBuf, String> {
        match value.as_ref().filter(|v| !v.is_empty()) {
            Some(v) if Path::new(v).is_file() => Ok(PathBuf::from(v)),
            Some(v) => Err(format!("{var}={} is not a file", Path::new(v).display())),
            None => self
                .on_path(name)
                .ok_or_else(|| format!("no `{name}` on PATH")),
        }
    }

    /// Checks everything: one entry per package, in install order (etcd-server, etcd-client,
    /// protobuf-compiler, libprotobuf-dev).
    pub fn check(&self) -> Vec<Prereq> {
        let etcd = self.binary("ETCD_BIN", &self.etcd_bin, "etcd");
        let etcdctl = self.binary("ETCDCTL_BIN", &self.etcdctl_bin, "etcdctl");
        let protoc = self.binary("PROTOC", &self.protoc, "protoc");
        let protos = self.well_known_protos(protoc.as_ref().ok());
        vec![
            Prereq {
                what: "etcd",
                package: "etcd-server",
                found: etcd,
                required: true,
            },
            Prereq {
                what: "etcdctl",
                package: "etcd-client",
                found: etcdctl,
                required: false,
            },
            Prereq {
                what: "protoc",
                package: "protobuf-compiler",
                found: protoc,
                required: true,
            },
            Prereq {
                what: "the well-known protos (google/protobuf/descriptor.proto)",
                package: "libprotobuf-dev",
                found: protos,
                required: true,
            },
        ]
    }

    /// The include directory holding `google/protobuf/descriptor.proto`: `$PROTOC_INCLUDE`, else
    /// the places protoc searches next to its own binary (`<dir>/include`, `<dir>/../include`),
    /// else `/usr/include` and `/usr/local/include`.
    pub fn well_known_protos(&self, protoc: Option<&PathBuf>) -> Result<PathBuf, String> {
        let marker = Path::new("google/protobuf/descriptor.proto");
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(inc) = self.protoc_include.as_ref().filter(|v| !v.is_empty()) {
            candidates.push(PathBuf::from(inc));
        } else {
            if let Some(dir) = protoc.and_then(|p| p.parent()) {
                candidates.push(dir.join("include"));
                if let Some(up) = dir.parent() {
                    candidates.push(up.join("include"));
                }
            }
            if protoc.is_none() {
                candidates.push(PathBuf::from("/usr/include"));
                candidates.push(PathBuf::from("/usr/local/include"));
            }
        }
        candidates
            .iter()
            .find(|dir| dir.join(marker).is_file())
            .cloned()
            .ok_or_else(|| {
                let looked: Vec<String> = candidates
                    .iter()
                    .map(|d| d.join(marker).display().to_string())
                    .collect();
                format!("none of {}", looked.join(", "))
            })
    }
}

/// Checks the prerequisites; as root installs the missing ones with apt (unless `check_only`),
/// otherwise says what to install. Returns false when a required one is still missing.
pub fn ensure(check_only: bool) -> bool {
    let probe = Probe::from_env();
    let first = probe.check();
    let missing: Vec<&Prereq> = first.iter().filter(|p| p.found.is_err()).collect();
    if missing.is_empty() {
        return true;
    }
    let packages: Vec<&str> = missing.iter().map(|p| p.package).collect();
    let describe = |list: &[&Prereq]| -> String {
        list.iter()
            .map(|p| {
                format!(
                    "  {} (Debian package {}): {}",
                    p.what,
                    p.package,
                    p.found.as_ref().err().map_or("", String::as_str)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let required_missing = missing.iter().any(|p| p.required);
    if check_only || !is_root() {
        let level = if required_missing {
            "missing"
        } else {
            "note: missing"
        };
        eprintln!(
            "xtask: {level}:\n{}\nInstall them with:\n\n    sudo apt-get update && sudo apt-get install -y {}\n\n\
             (or set ETCD_BIN / ETCDCTL_BIN / PROTOC / PROTOC_INCLUDE to existing ones)",
            describe(&missing),
            packages.join(" ")
        );
        return !required_missing;
    }
    eprintln!(
        "xtask: missing:\n{}\ninstalling {} with apt-get",
        describe(&missing),
        packages.join(" ")
    );
    let apt = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run(cmd)
    };
    if apt(&["update"]) != 0 {
        eprintln!("xtask: apt-get update failed");
        return false;
    }
    // --no-install-recommends keeps the install small; that is why libprotobuf-dev (only
    // recommended by protobuf-compiler) is named explicitly.
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(&packages);
    if apt(&install) != 0 {
        eprintln!("xtask: apt-get install {} failed", packages.join(" "));
        return false;
    }
    let still: Vec<Prereq> = Probe::from_env()
        .check()
        .into_iter()
        .filter(|p| p.found.is_err())
        .collect();
    if still.is_empty() {
        return true;
    }
    let still_refs: Vec<&Prereq> = still.iter().collect();
    eprintln!(
        "xtask: still missing after installing:\n{}\n(ETCD_BIN / ETCDCTL_BIN / PROTOC / PROTOC_INCLUDE \
         may point elsewhere; unset them or fix them)",
        describe(&still_refs)
    );
    !still.iter().any(|p| p.required)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let dir = env::temp_dir().join(format!("xtask-prereqs-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        fn file(&self, rel: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "").unwrap();
            p
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn probe(path: &Path) -> Probe {
        Probe {
            etcd_bin: None,
            etcdctl_bin: None,
            protoc: None,
            protoc_include: None,
            path: Some(path.as_os_str().to_owned()),
        }
    }

    #[test]
    fn nothing_installed_means_every_package() {
        let s = Scratch::new("none");
        let mut p = probe(&s.0.join("bin"));
        // A protoc without includes next to it: the well-known protos count as missing even
        // when /usr/include has them, because protoc would not look there.
        let protoc = s.file("opt/bin/protoc");
        p.protoc = Some(protoc.into_os_string());
        let checks = p.check();
        let missing: Vec<&str> = checks
            .iter()
            .filter(|c| c.found.is_err())
            .map(|c| c.package)
            .collect();
        assert_eq!(missing, ["etcd-server", "etcd-client", "libprotobuf-dev"]);
        assert_eq!(
            checks.iter().map(|c| c.package).collect::<Vec<_>>(),
            [
                "etcd-server",
                "etcd-client",
                "protobuf-compiler",
                "libprotobuf-dev"
            ]
        );
        let protos = checks[3].found.as_ref().unwrap_err();
        assert!(
            protos.contains("opt/include/google/protobuf/descriptor.proto"),
            "{protos}"
        );
    }

    #[test]
    fn protoc_alone_is_not_enough() {
        let s = Scratch::new("protoc");
        s.file("bin/etcd");
        s.file("bin/etcdctl");
        s.file("bin/protoc");
        let checks = probe(&s.0.join("bin")).check();
        assert!(checks[0].found.is_ok() && checks[1].found.is_ok() && checks[2].found.is_ok());
        assert!(checks[3].found.is_err(), "{:?}", checks[3]);
        assert!(checks[3].required);

        // Debian's layout: /usr/bin/protoc and /usr/include/google/protobuf/*.proto.
        s.file("include/google/protobuf/descriptor.proto");
        let checks = probe(&s.0.join("bin")).check();
        assert_eq!(checks[3].found, Ok(s.0.join("include")));
    }

    #[test]
    fn env_overrides_are_checked() {
        let s = Scratch::new("env");
        let mut p = probe(&s.0.join("bin"));
        p.etcd_bin = Some(s.0.join("nope").into_os_string());
        p.protoc = Some(s.file("x/protoc").into_os_string());
        p.protoc_include = Some(s.0.join("inc").into_os_string());
        let checks = p.check();
        assert!(checks[0].found.as_ref().unwrap_err().contains("ETCD_BIN="));
        assert!(checks[2].found.is_ok());
        assert!(checks[3].found.is_err());
        s.file("inc/google/protobuf/descriptor.proto");
        assert_eq!(p.check()[3].found, Ok(s.0.join("inc")));
    }
}
