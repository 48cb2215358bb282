//! The signal StopContainer sends first.

use crius_api::v1::{ContainerConfig, Signal};

use super::error::{Result, SpecError};
use super::image::ImageConfig;

/// glibc's SIGRTMIN and SIGRTMAX as programs see them (the kernel's 32 and 33 are kept by
/// the threading library), the numbering Docker and containerd use.
const RTMIN: i32 = 34;
const RTMAX: i32 = 64;

/// The effective stop signal as a number: the CRI `stop_signal` unless `RUNTIME_DEFAULT`, else
/// the image's `StopSignal`, else SIGTERM.
pub fn stop_signal(config: &ContainerConfig, image_config: &serde_json::Value) -> Result<i32> {
    if config.stop_signal != Signal::RuntimeDefault as i32 {
        let signal = Signal::try_from(config.stop_signal).map_err(|_| {
            SpecError::invalid(format!("stop_signal {} is unknown", config.stop_signal))
        })?;
        return parse_signal(cri_name(signal)).ok_or_else(|| {
            SpecError::invalid(format!("stop_signal {} is unknown", cri_name(signal)))
        });
    }
    let image = ImageConfig::new(image_config);
    match image.stop_signal() {
        Some(s) if !s.is_empty() => parse_signal(s)
            .ok_or_else(|| SpecError::invalid(format!("image StopSignal {s} is unknown"))),
        _ => Ok(libc::SIGTERM),
    }
}

/// The CRI name of signal number `n` (the first enum value naming it: `SIGABRT` over its alias
/// `SIGIOT`), or `RUNTIME_DEFAULT` for a number the CRI has no name for.
pub fn cri_signal(n: i32) -> Signal {
    (1..)
        .map_while(|v| Signal::try_from(v).ok())
        .find(|s| parse_signal(cri_name(*s)) == Some(n))
        .unwrap_or(Signal::RuntimeDefault)
}

/// The signal's name in the CRI enum without the `SIGNAL_` prefix cri-api v0.37 gave every
/// value (`SIGNAL_SIGRTMINPLUS3` → `SIGRTMINPLUS3`).
pub(crate) fn cri_name(signal: Signal) -> &'static str {
    let name = signal.as_str_name();
    name.strip_prefix("SIGNAL_").unwrap_or(name)
}

/// Parses `SIGTERM`, `TERM`, `15`, `SIGRTMIN+3`, `RTMAX-1` and the CRI enum names
/// (`SIGRTMINPLUS3`, `SIGRTMAXMINUS1`).
pub(crate) fn parse_signal(text: &str) -> Option<i32> {
    let t = text.trim().to_ascii_uppercase();
    if let Ok(n) = t.parse::<i32>() {
        return (1..=RTMAX).contains(&n).then_some(n);
    }
    let name = t.strip_prefix("SIG").unwrap_or(&t);
    let rt = |base: i32, rest: &str, sign: i32| -> Option<i32> {
        let n = if rest.is_empty() {
            0
        } else if rest.bytes().all(|b| b.is_ascii_digit()) {
            rest.parse::<i32>().ok()?
        } else {
            return None;
        };
        let v = base + sign * n;
        (RTMIN..=RTMAX).contains(&v).then_some(v)
    };
    if let Some(rest) = name.strip_prefix("RTMINPLUS") {
        return rt(RTMIN, rest, 1);
    }
    if let Some(rest) = name.strip_prefix("RTMAXMINUS") {
        return rt(RTMAX, rest, -1);
    }
    if let Some(rest) = name.strip_prefix("RTMIN") {
        return match rest.strip_prefix('+') {
            Some(n) if !n.is_empty() => rt(RTMIN, n, 1),
            _ if rest.is_empty() => Some(RTMIN),
            _ => None,
        };
    }
    if let Some(rest) = name.strip_prefix("RTMAX") {
        return match rest.strip_prefix('-') {
            Some(n) if !n.is_empty() => rt(RTMAX, n, -1),
            _ if rest.is_empty() => Some(RTMAX),
            _ => None,
        };
    }
    let n = match name {
        "ABRT" | "IOT" => libc::SIGABRT,
        "ALRM" => libc::SIGALRM,
        "BUS" => libc::SIGBUS,
        "CHLD" | "CLD" => libc::SIGCHLD,
        "CONT" => libc::SIGCONT,
        "FPE" => libc::SIGFPE,
        "HUP" => libc::SIGHUP,
        "ILL" => libc::SIGILL,
        "INT" => libc::SIGINT,
        "IO" | "POLL" => libc::SIGIO,
        "KILL" => libc::SIGKILL,
        "PIPE" => libc::SIGPIPE,
        "PROF" => libc::SIGPROF,
        "PWR" => libc::SIGPWR,
        "QUIT" => libc::SIGQUIT,
        "SEGV" => libc::SIGSEGV,
        "STKFLT" => libc::SIGSTKFLT,
        "STOP" => libc::SIGSTOP,
        "SYS" => libc::SIGSYS,
        "TERM" => libc::SIGTERM,
        "TRAP" => libc::SIGTRAP,
        "TSTP" => libc::SIGTSTP,
        "TTIN" => libc::SIGTTIN,
        "TTOU" => libc::SIGTTOU,
        "URG" => libc::SIGURG,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "VTALRM" => libc::SIGVTALRM,
        "WINCH" => libc::SIGWINCH,
        "XCPU" => libc::SIGXCPU,
        "XFSZ" => libc::SIGXFSZ,
        _ => return None,
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(signal: Signal) -> ContainerConfig {
        ContainerConfig {
            stop_signal: signal as i32,
            ..Default::default()
        }
    }

    #[test]
    fn numbers_to_cri_names() {
        assert_eq!(cri_signal(libc::SIGTERM), Signal::Sigterm);
        assert_eq!(cri_signal(libc::SIGABRT), Signal::Sigabrt);
        assert_eq!(cri_signal(libc::SIGUSR1), Signal::Sigusr1);
        assert_eq!(cri_signal(RTMIN + 3), Signal::Sigrtminplus3);
        assert_eq!(cri_signal(RTMAX), Signal::Sigrtmax);
        assert_eq!(cri_signal(0), Signal::RuntimeDefault);
    }

    #[test]
    fn cri_then_image_then_sigterm() {
        let image = json!({"config": {"StopSignal": "SIGQUIT"}});
        assert_eq!(
            stop_signal(&config(Signal::Sigusr1), &image).unwrap(),
            libc::SIGUSR1
        );
        assert_eq!(
            stop_signal(&config(Signal::RuntimeDefault), &image).unwrap(),
            libc::SIGQUIT
        );
        assert_eq!(
            stop_signal(&config(Signal::RuntimeDefault), &json!({"config": {}})).unwrap(),
            libc::SIGTERM
        );
        assert_eq!(
            stop_signal(&config(Signal::RuntimeDefault), &json!({})).unwrap(),
            libc::SIGTERM
        );
        let bad = json!({"config": {"StopSignal": "SIGNOPE"}});
        assert!(stop_signal(&config(Signal::RuntimeDefault), &bad)
            .unwrap_err()
            .is_invalid_argument());
    }

    #[test]
    fn signal_forms() {
        assert_eq!(parse_signal("TERM"), Some(15));
        assert_eq!(parse_signal("9"), Some(9));
        assert_eq!(parse_signal("sigwinch"), Some(28));
        assert_eq!(parse_signal("SIGRTMIN"), Some(34));
        assert_eq!(parse_signal("SIGRTMIN+3"), Some(37));
        assert_eq!(parse_signal("SIGRTMINPLUS3"), Some(37));
        assert_eq!(parse_signal("SIGRTMAX-1"), Some(63));
        assert_eq!(parse_signal("SIGRTMAXMINUS14"), Some(50));
        assert_eq!(parse_signal("SIGRTMAX"), Some(64));
        assert_eq!(parse_signal("0"), None);
        assert_eq!(parse_signal("SIGRTMAX+1"), None);
        // every CRI enum value maps to a signal
        for n in 1..=65 {
            let s = Signal::try_from(n).unwrap();
            assert!(parse_signal(cri_name(s)).is_some(), "{}", cri_name(s));
        }
    }
}
