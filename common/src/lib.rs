//! What every crius crate needs from the file system and had written once each: replacing a
//! file atomically with an explicit durability, reading `/proc/self/mountinfo`, removing a
//! cgroup directory tree, letting go of the code pages start-up mapped, and dates from day
//! counts. std and libc only, as the shim links it.

pub mod fs;
pub mod mountinfo;
pub mod text_pages;

/// Proleptic Gregorian (year, month, day) of a day count since 1970-01-01 (H. Hinnant's
/// `civil_from_days`), for RFC 3339 times without a date crate (the shim's budget).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

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
