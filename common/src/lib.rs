//! What every crius crate needs from the file system and had written once each: replacing a
//! file atomically with an explicit durability, reading `/proc/self/mountinfo`, and removing a
//! cgroup directory tree. std and libc only, as the shim links it.

pub mod fs;
pub mod mountinfo;

/// An error and its causes on one line, `error: cause: cause`, for logs and status messages
/// (a library's top-level message alone often says little). A cause whose text the line
/// already ends with is not repeated (errors that print their source in their own message).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// For tests that need root (mounts, chown, the full capability set, a system bus): whether
/// test `name` can run. Without root it says the test is skipped, and the test returns (`make
/// unit` runs without root).
pub fn test_needs_root(name: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped {name}: needs root");
    }
    root
}

#[cfg(test)]
mod tests {
    use std::io;

    #[derive(Debug)]
    struct Wrapped(io::Error, bool);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            if self.1 {
                write!(f, "open config: {}", self.0)
            } else {
                write!(f, "open config")
            }
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn joins_causes_without_repeating_one_the_message_holds() {
        let cause = || io::Error::new(io::ErrorKind::NotFound, "no such file");
        assert_eq!(
            super::error_chain(&Wrapped(cause(), false)),
            "open config: no such file"
        );
        assert_eq!(
            super::error_chain(&Wrapped(cause(), true)),
            "open config: no such file"
        );
    }
}
