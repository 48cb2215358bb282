//! Command, environment and working directory of a container: CRI config merged with the
//! image config the way kubelet and containerd expect.

use std::path::PathBuf;

use crius_api::v1::ContainerConfig;

use super::error::{Result, SpecError};
use super::image::ImageConfig;

/// PATH when neither the image nor the request sets one.
pub(crate) const DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The process arguments.
///
/// `command` replaces the image's Entrypoint and then the image's Cmd is not used; `args`
/// replace Cmd. Without `command` the image Entrypoint is used, unless it is the single empty
/// string Docker writes for `ENTRYPOINT [""]`. Nothing left to run is an `InvalidArgument`.
pub(crate) fn args(config: &ContainerConfig, image: &ImageConfig<'_>) -> Result<Vec<String>> {
    let mut command = config.command.clone();
    let mut args = config.args.clone();
    if command.is_empty() {
        if args.is_empty() {
            args = image.cmd()?;
        }
        if let Some(entrypoint) = image.entrypoint()? {
            if !(entrypoint.len() == 1 && entrypoint[0].is_empty()) {
                command = entrypoint;
            }
        }
    }
    command.extend(args);
    if command.is_empty() {
        return Err(SpecError::invalid("no command specified"));
    }
    Ok(command)
}

fn key_of(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(k, _)| k)
}

/// Applies `updates` to `env`: `KEY=value` replaces the variable in place or appends it; a bare
/// `KEY` removes it.
pub(crate) fn merge_env(env: &mut Vec<String>, updates: impl IntoIterator<Item = String>) {
    for update in updates {
        let key = key_of(&update).to_string();
        if !update.contains('=') {
            env.retain(|e| key_of(e) != key);
            continue;
        }
        match env.iter_mut().find(|e| key_of(e) == key) {
            Some(slot) => *slot = update,
            None => env.push(update),
        }
    }
}

/// The process environment: a default PATH, `TERM=xterm` for a TTY, `HOSTNAME`, then the
/// image's Env, then the CRI envs, each overriding earlier values of the same key.
pub(crate) fn env(
    config: &ContainerConfig,
    image: &ImageConfig<'_>,
    hostname: &str,
) -> Result<Vec<String>> {
    let mut env = vec![DEFAULT_PATH.to_string()];
    if config.tty {
        merge_env(&mut env, ["TERM=xterm".to_string()]);
    }
    merge_env(&mut env, [format!("HOSTNAME={hostname}")]);
    merge_env(&mut env, image.env()?);
    let mut cri = Vec::with_capacity(config.envs.len());
    for kv in &config.envs {
        if kv.key.is_empty() || kv.key.contains('=') {
            return Err(SpecError::invalid(format!(
                "env key {:?} is not a valid variable name",
                kv.key
            )));
        }
        let value = String::from_utf8(kv.value.clone())
            .map_err(|_| SpecError::invalid(format!("env {} value is not valid UTF-8", kv.key)))?;
        cri.push(format!("{}={value}", kv.key));
    }
    merge_env(&mut env, cri);
    Ok(env)
}

/// The working directory: the CRI `working_dir`, else the image's WorkingDir, else `/`.
pub(crate) fn cwd(config: &ContainerConfig, image: &ImageConfig<'_>) -> Result<PathBuf> {
    if !config.working_dir.is_empty() {
        if !config.working_dir.starts_with('/') {
            return Err(SpecError::invalid(format!(
                "working_dir {} is not absolute",
                config.working_dir
            )));
        }
        return Ok(PathBuf::from(&config.working_dir));
    }
    let dir = image.working_dir();
    if dir.is_empty() {
        Ok(PathBuf::from("/"))
    } else {
        // Docker accepts a relative WORKDIR and resolves it from /
        Ok(PathBuf::from("/").join(dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crius_api::v1::KeyValue;
    use serde_json::json;

    fn config(command: &[&str], args: &[&str]) -> ContainerConfig {
        ContainerConfig {
            command: command.iter().map(|s| s.to_string()).collect(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn args_merge_like_kubelet_expects() {
        let v = json!({"config": {"Entrypoint": ["/entry"], "Cmd": ["cmd", "x"]}});
        let img = ImageConfig::new(&v);
        assert_eq!(
            args(&config(&[], &[]), &img).unwrap(),
            ["/entry", "cmd", "x"]
        );
        assert_eq!(args(&config(&[], &["a"]), &img).unwrap(), ["/entry", "a"]);
        assert_eq!(args(&config(&["/bin/sh"], &[]), &img).unwrap(), ["/bin/sh"]);
        assert_eq!(
            args(&config(&["/bin/sh"], &["-c", "true"]), &img).unwrap(),
            ["/bin/sh", "-c", "true"]
        );
        let v = json!({"config": {"Entrypoint": [""], "Cmd": ["sh"]}});
        assert_eq!(
            args(&config(&[], &[]), &ImageConfig::new(&v)).unwrap(),
            ["sh"]
        );
        let v = json!({"config": {"Entrypoint": null, "Cmd": null}});
        let err = args(&config(&[], &[]), &ImageConfig::new(&v)).unwrap_err();
        assert!(err.is_invalid_argument());
        assert_eq!(err.to_string(), "no command specified");
    }

    #[test]
    fn env_image_then_cri_overriding_by_key() {
        let v = json!({"config": {"Env": ["PATH=/img/bin", "A=1", "B=2"]}});
        let mut c = config(&[], &[]);
        c.envs = vec![
            KeyValue {
                key: "B".into(),
                value: b"cri".to_vec(),
            },
            KeyValue {
                key: "C".into(),
                value: b"x=y".to_vec(),
            },
        ];
        let env = env(&c, &ImageConfig::new(&v), "pod-host").unwrap();
        assert_eq!(
            env,
            [
                "PATH=/img/bin",
                "HOSTNAME=pod-host",
                "A=1",
                "B=cri",
                "C=x=y"
            ]
        );
        c.tty = true;
        let env = super::env(&c, &ImageConfig::new(&json!({})), "h").unwrap();
        assert_eq!(env[0], DEFAULT_PATH);
        assert!(env.contains(&"TERM=xterm".to_string()));
        c.envs = vec![KeyValue {
            key: "BAD".into(),
            value: vec![0xff, 0xfe],
        }];
        assert!(super::env(&c, &ImageConfig::new(&json!({})), "h")
            .unwrap_err()
            .to_string()
            .contains("BAD"));
    }

    #[test]
    fn merge_env_removes_bare_keys() {
        let mut env = vec!["A=1".to_string(), "B=2".to_string()];
        merge_env(&mut env, ["A".to_string(), "C=3".to_string()]);
        assert_eq!(env, ["B=2", "C=3"]);
    }

    #[test]
    fn working_dir_precedence() {
        let v = json!({"config": {"WorkingDir": "/app"}});
        let img = ImageConfig::new(&v);
        let mut c = config(&[], &[]);
        assert_eq!(cwd(&c, &img).unwrap(), PathBuf::from("/app"));
        c.working_dir = "/work".into();
        assert_eq!(cwd(&c, &img).unwrap(), PathBuf::from("/work"));
        assert_eq!(
            cwd(&config(&[], &[]), &ImageConfig::new(&json!({}))).unwrap(),
            PathBuf::from("/")
        );
        c.working_dir = "rel".into();
        assert!(cwd(&c, &img).unwrap_err().is_invalid_argument());
    }
}
