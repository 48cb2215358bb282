//! Wall-clock timestamps: Unix nanoseconds and their RFC 3339 form.

use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch now (0 if the clock is before 1970).
pub fn now_unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// RFC 3339 in UTC with all nine fractional digits, e.g. `2023-11-14T22:13:20.123456789Z`.
///
/// Fixed-width nanoseconds keep CRI log lines aligned and sortable as text; Go's
/// `time.RFC3339Nano` parser (kubelet) accepts them.
pub fn rfc3339_nanos(unix_nanos: i64) -> String {
    let secs = unix_nanos.div_euclid(1_000_000_000);
    let nanos = unix_nanos.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = crius_common::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_nanos(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339_nanos(951_782_400 * 1_000_000_000 + 5),
            "2000-02-29T00:00:00.000000005Z"
        );
        assert_eq!(
            rfc3339_nanos(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456789Z"
        );
        assert_eq!(
            rfc3339_nanos(4_102_444_799 * 1_000_000_000),
            "2099-12-31T23:59:59.000000000Z"
        );
    }

    #[test]
    fn now_is_after_2020() {
        assert!(now_unix_nanos() > 1_577_836_800 * 1_000_000_000);
    }
}
