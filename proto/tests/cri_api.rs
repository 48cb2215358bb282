//! Guards `runtime/v1/api.proto` against edits that would break wire compatibility with the
//! published CRI (k8s.io/cri-api main at 791729b, the v0.37 line): service and RPC lists, streaming shapes, the field
//! numbers and types kubelet depends on, enum values and field options.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use crius_api::v1;
use prost::Message;
use protox::prost_reflect::{
    Cardinality, DescriptorPool, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor,
};

fn pool() -> DescriptorPool {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut compiler = protox::Compiler::new([dir]).unwrap();
    compiler.open_file("runtime/v1/api.proto").unwrap();
    compiler.descriptor_pool()
}

fn message(pool: &DescriptorPool, name: &str) -> MessageDescriptor {
    pool.get_message_by_name(&format!("runtime.v1.{name}"))
        .unwrap_or_else(|| panic!("message {name} missing"))
}

fn field(msg: &MessageDescriptor, name: &str) -> FieldDescriptor {
    msg.get_field_by_name(name)
        .unwrap_or_else(|| panic!("field {}.{name} missing", msg.name()))
}

fn enumeration(pool: &DescriptorPool, name: &str) -> EnumDescriptor {
    pool.get_enum_by_name(&format!("runtime.v1.{name}"))
        .unwrap_or_else(|| panic!("enum {name} missing"))
}

/// Asserts that every `(name, number)` pair exists in `msg`, and that `msg` has no other fields.
fn assert_fields(pool: &DescriptorPool, msg: &str, expected: &[(&str, u32)]) {
    let desc = message(pool, msg);
    for (name, number) in expected {
        assert_eq!(field(&desc, name).number(), *number, "{msg}.{name}");
    }
    assert_eq!(
        desc.fields().count(),
        expected.len(),
        "field count of {msg}"
    );
}

fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Message(m) => m.full_name().to_owned(),
        Kind::Enum(e) => e.full_name().to_owned(),
        other => format!("{other:?}"),
    }
}

const RUNTIME_RPCS: [&str; 37] = [
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "StreamPodSandboxes",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "StreamContainers",
    "ContainerStatus",
    "UpdateContainerResources",
    "ReopenContainerLog",
    "ExecSync",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "StreamContainerStats",
    "PodSandboxStats",
    "ListPodSandboxStats",
    "StreamPodSandboxStats",
    "UpdateRuntimeConfig",
    "Status",
    "CheckpointContainer",
    "CheckpointPod",
    "RestorePod",
    "GetContainerEvents",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "StreamPodSandboxMetrics",
    "RuntimeConfig",
    "UpdatePodSandboxResources",
];

const IMAGE_RPCS: [&str; 6] = [
    "ListImages",
    "StreamImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
    "ImageFsInfo",
];

/// The RPCs whose response is a server stream; no RPC streams its request.
const SERVER_STREAMING: [&str; 7] = [
    "StreamPodSandboxes",
    "StreamContainers",
    "StreamContainerStats",
    "StreamPodSandboxStats",
    "GetContainerEvents",
    "StreamPodSandboxMetrics",
    "StreamImages",
];

#[test]
fn package_has_two_services_with_43_rpcs() {
    let pool = pool();
    let file = pool.get_file_by_name("runtime/v1/api.proto").unwrap();
    assert_eq!(file.package_name(), "runtime.v1");
    let services: Vec<_> = file.services().map(|s| s.name().to_owned()).collect();
    assert_eq!(services, ["RuntimeService", "ImageService"]);
    assert_eq!(file.messages().count(), 175);
    assert_eq!(file.enums().count(), 10);

    let mut total = 0;
    for (service, expected) in [
        ("RuntimeService", &RUNTIME_RPCS[..]),
        ("ImageService", &IMAGE_RPCS[..]),
    ] {
        let svc = pool
            .get_service_by_name(&format!("runtime.v1.{service}"))
            .unwrap();
        let names: Vec<_> = svc.methods().map(|m| m.name().to_owned()).collect();
        assert_eq!(names, expected, "{service}");
        for method in svc.methods() {
            let name = method.name();
            assert!(!method.is_client_streaming(), "{name}");
            assert_eq!(
                method.is_server_streaming(),
                SERVER_STREAMING.contains(&name),
                "{name}"
            );
            total += 1;
        }
    }
    assert_eq!(total, 43);
}

#[test]
fn rpc_request_and_response_types() {
    let pool = pool();
    let rt = pool
        .get_service_by_name("runtime.v1.RuntimeService")
        .unwrap();
    for method in rt.methods() {
        let (input, output) = (method.input(), method.output());
        let (input, output) = (input.name(), output.name());
        match method.name() {
            "GetContainerEvents" => {
                assert_eq!(
                    (input, output),
                    ("GetEventsRequest", "ContainerEventResponse")
                );
            }
            name => {
                assert_eq!(input, format!("{name}Request"));
                assert_eq!(output, format!("{name}Response"));
            }
        }
    }
}

#[test]
fn pod_sandbox_config_fields() {
    let pool = pool();
    assert_fields(
        &pool,
        "PodSandboxConfig",
        &[
            ("metadata", 1),
            ("hostname", 2),
            ("log_directory", 3),
            ("dns_config", 4),
            ("port_mappings", 5),
            ("labels", 6),
            ("annotations", 7),
            ("linux", 8),
            ("windows", 9),
        ],
    );
    let cfg = message(&pool, "PodSandboxConfig");
    assert!(field(&cfg, "port_mappings").is_list());
    assert!(field(&cfg, "labels").is_map());
    assert!(field(&cfg, "annotations").is_map());
    assert_fields(
        &pool,
        "PodSandboxMetadata",
        &[("name", 1), ("uid", 2), ("namespace", 3), ("attempt", 4)],
    );
    assert_fields(
        &pool,
        "LinuxPodSandboxConfig",
        &[
            ("cgroup_parent", 1),
            ("security_context", 2),
            ("sysctls", 3),
            ("overhead", 4),
            ("resources", 5),
        ],
    );
    let sc = message(&pool, "LinuxSandboxSecurityContext");
    assert_eq!(field(&sc, "run_as_group").number(), 8);
    assert_eq!(field(&sc, "supplemental_groups_policy").number(), 11);
    assert_eq!(field(&sc, "seccomp").number(), 9);
    assert_fields(
        &pool,
        "NamespaceOption",
        &[
            ("network", 1),
            ("pid", 2),
            ("ipc", 3),
            ("target_id", 4),
            ("userns_options", 5),
        ],
    );
    assert_fields(
        &pool,
        "RunPodSandboxRequest",
        &[("config", 1), ("runtime_handler", 2)],
    );
}

#[test]
fn container_config_fields() {
    let pool = pool();
    assert_fields(
        &pool,
        "ContainerConfig",
        &[
            ("metadata", 1),
            ("image", 2),
            ("command", 3),
            ("args", 4),
            ("working_dir", 5),
            ("envs", 6),
            ("mounts", 7),
            ("devices", 8),
            ("labels", 9),
            ("annotations", 10),
            ("log_path", 11),
            ("stdin", 12),
            ("stdin_once", 13),
            ("tty", 14),
            ("linux", 15),
            ("windows", 16),
            ("CDI_devices", 17),
            ("stop_signal", 18),
        ],
    );
    let cfg = message(&pool, "ContainerConfig");
    assert_eq!(
        kind_name(&field(&cfg, "envs").kind()),
        "runtime.v1.KeyValue"
    );
    assert_eq!(field(&cfg, "envs").cardinality(), Cardinality::Repeated);
    assert_eq!(
        kind_name(&field(&cfg, "stop_signal").kind()),
        "runtime.v1.Signal"
    );

    // v0.36.3 made env values bytes so that non-UTF-8 values survive.
    let kv = message(&pool, "KeyValue");
    assert_eq!(field(&kv, "value").kind(), Kind::Bytes);

    let lsc = message(&pool, "LinuxContainerSecurityContext");
    for (name, number) in [
        ("capabilities", 1),
        ("privileged", 2),
        ("namespace_options", 3),
        ("run_as_user", 5),
        ("run_as_username", 6),
        ("readonly_rootfs", 7),
        ("no_new_privs", 11),
        ("run_as_group", 12),
        ("masked_paths", 13),
        ("readonly_paths", 14),
        ("seccomp", 15),
        ("apparmor", 16),
        ("supplemental_groups_policy", 17),
    ] {
        assert_eq!(field(&lsc, name).number(), number, "{name}");
    }
    assert_fields(
        &pool,
        "Mount",
        &[
            ("container_path", 1),
            ("host_path", 2),
            ("readonly", 3),
            ("selinux_relabel", 4),
            ("propagation", 5),
            ("uidMappings", 6),
            ("gidMappings", 7),
            ("recursive_read_only", 8),
            ("image", 9),
            ("image_sub_path", 10),
            ("mount_options", 11),
        ],
    );
    assert_fields(
        &pool,
        "LinuxContainerResources",
        &[
            ("cpu_period", 1),
            ("cpu_quota", 2),
            ("cpu_shares", 3),
            ("memory_limit_in_bytes", 4),
            ("oom_score_adj", 5),
            ("cpuset_cpus", 6),
            ("cpuset_mems", 7),
            ("hugepage_limits", 8),
            ("unified", 9),
            ("memory_swap_limit_in_bytes", 10),
        ],
    );
    assert_fields(
        &pool,
        "ImageSpec",
        &[
            ("image", 1),
            ("annotations", 2),
            ("user_specified_image", 18),
            ("runtime_handler", 19),
            ("image_ref", 20),
        ],
    );
}

#[test]
fn container_status_fields() {
    let pool = pool();
    assert_fields(
        &pool,
        "ContainerStatus",
        &[
            ("id", 1),
            ("metadata", 2),
            ("state", 3),
            ("created_at", 4),
            ("started_at", 5),
            ("finished_at", 6),
            ("exit_code", 7),
            ("image", 8),
            ("image_ref", 9),
            ("reason", 10),
            ("message", 11),
            ("labels", 12),
            ("annotations", 13),
            ("mounts", 14),
            ("log_path", 15),
            ("resources", 16),
            ("image_id", 17),
            ("user", 18),
            ("stop_signal", 19),
        ],
    );
    let status = message(&pool, "ContainerStatus");
    assert_eq!(field(&status, "exit_code").kind(), Kind::Int32);
    assert_eq!(field(&status, "created_at").kind(), Kind::Int64);
    assert_fields(
        &pool,
        "PodSandboxStatus",
        &[
            ("id", 1),
            ("metadata", 2),
            ("state", 3),
            ("created_at", 4),
            ("network", 5),
            ("linux", 6),
            ("labels", 7),
            ("annotations", 8),
            ("runtime_handler", 9),
        ],
    );
    assert_fields(&pool, "PullImageResponse", &[("image_ref", 1)]);
    assert_fields(
        &pool,
        "Image",
        &[
            ("id", 1),
            ("repo_tags", 2),
            ("repo_digests", 3),
            ("size", 4),
            ("uid", 5),
            ("username", 6),
            ("spec", 7),
            ("pinned", 8),
        ],
    );
    let exec = message(&pool, "ExecSyncResponse");
    assert_eq!(field(&exec, "stdout").kind(), Kind::Bytes);
    assert_eq!(field(&exec, "exit_code").number(), 3);
}

#[test]
fn enum_values() {
    let pool = pool();
    let values = |name: &str| -> Vec<(String, i32)> {
        enumeration(&pool, name)
            .values()
            .map(|v| (v.name().to_owned(), v.number()))
            .collect()
    };
    let owned = |pairs: &[(&str, i32)]| -> Vec<(String, i32)> {
        pairs.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect()
    };
    assert_eq!(
        values("ContainerState"),
        owned(&[
            ("CONTAINER_CREATED", 0),
            ("CONTAINER_RUNNING", 1),
            ("CONTAINER_EXITED", 2),
            ("CONTAINER_UNKNOWN", 3),
        ])
    );
    assert_eq!(
        values("PodSandboxState"),
        owned(&[("SANDBOX_READY", 0), ("SANDBOX_NOTREADY", 1)])
    );
    assert_eq!(
        values("NamespaceMode"),
        owned(&[("POD", 0), ("CONTAINER", 1), ("NODE", 2), ("TARGET", 3)])
    );
    assert_eq!(
        values("MountPropagation"),
        owned(&[
            ("PROPAGATION_PRIVATE", 0),
            ("PROPAGATION_HOST_TO_CONTAINER", 1),
            ("PROPAGATION_BIDIRECTIONAL", 2),
        ])
    );
    assert_eq!(
        values("CgroupDriver"),
        owned(&[("SYSTEMD", 0), ("CGROUPFS", 1)])
    );
    assert_eq!(
        values("Protocol"),
        owned(&[("TCP", 0), ("UDP", 1), ("SCTP", 2)])
    );
    let signal = values("Signal");
    assert_eq!(signal.len(), 66);
    assert_eq!(signal[0], ("SIGNAL_RUNTIME_DEFAULT".to_owned(), 0));
    assert!(signal.contains(&("SIGNAL_SIGTERM".to_owned(), 23)));
    assert!(signal.contains(&("SIGNAL_SIGKILL".to_owned(), 13)));
    assert_eq!(signal[65], ("SIGNAL_SIGRTMAX".to_owned(), 65));
    let profile = pool
        .get_enum_by_name("runtime.v1.SecurityProfile.ProfileType")
        .unwrap();
    let profile: Vec<_> = profile
        .values()
        .map(|v| (v.name().to_owned(), v.number()))
        .collect();
    assert_eq!(
        profile,
        owned(&[("RuntimeDefault", 0), ("Unconfined", 1), ("Localhost", 2)])
    );
}

#[test]
fn secrets_are_debug_redacted_and_old_fields_deprecated() {
    let pool = pool();
    let auth = message(&pool, "AuthConfig");
    let redacted = |name: &str| {
        field(&auth, name)
            .options()
            .get_field_by_name("debug_redact")
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    };
    for name in ["password", "auth", "identity_token", "registry_token"] {
        assert!(redacted(name), "AuthConfig.{name} must be debug_redact");
    }
    for name in ["username", "server_address"] {
        assert!(!redacted(name), "AuthConfig.{name}");
    }
    let deprecated = |msg: &str, name: &str| {
        field(&message(&pool, msg), name)
            .options()
            .get_field_by_name("deprecated")
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    };
    assert!(deprecated(
        "LinuxSandboxSecurityContext",
        "seccomp_profile_path"
    ));
    assert!(deprecated(
        "LinuxContainerSecurityContext",
        "seccomp_profile_path"
    ));
    assert!(deprecated(
        "LinuxContainerSecurityContext",
        "apparmor_profile"
    ));
}

/// The generated Rust types put the same tags on the wire as the descriptor says.
#[test]
fn generated_types_encode_expected_tags() {
    let status = v1::ContainerStatus {
        reason: "OOMKilled".to_owned(),
        ..Default::default()
    };
    let bytes = status.encode_to_vec();
    // Field 10, wire type 2 (length-delimited): (10 << 3) | 2.
    assert_eq!(bytes[0], (10 << 3) | 2);
    assert_eq!(&bytes[2..], b"OOMKilled");

    let exited = v1::ContainerStatus {
        state: v1::ContainerState::ContainerExited as i32,
        exit_code: -1,
        ..Default::default()
    };
    let decoded = v1::ContainerStatus::decode(exited.encode_to_vec().as_slice()).unwrap();
    assert_eq!(decoded.state(), v1::ContainerState::ContainerExited);
    assert_eq!(decoded.exit_code, -1);

    // A non-UTF-8 environment value must round-trip (it would be rejected as a string).
    let env = v1::KeyValue {
        key: "BIN".to_owned(),
        value: vec![0xff, 0xfe, b'x'],
    };
    let decoded = v1::KeyValue::decode(env.encode_to_vec().as_slice()).unwrap();
    assert_eq!(decoded.value, [0xff, 0xfe, b'x']);

    let config = v1::PodSandboxConfig {
        log_directory: "/var/log/pods/crius".to_owned(),
        ..Default::default()
    };
    assert_eq!(config.encode_to_vec()[0], (3 << 3) | 2);
}

/// One line per service method, message field and enum value, with everything that reaches the
/// wire or the JSON names: a stable text form of the schema that ignores comments and layout.
fn canonical_schema(pool: &DescriptorPool) -> String {
    let mut lines = Vec::new();
    for svc in pool.services() {
        for m in svc.methods() {
            lines.push(format!(
                "rpc {}.{}({}{}) -> {}{}",
                svc.full_name(),
                m.name(),
                if m.is_client_streaming() {
                    "stream "
                } else {
                    ""
                },
                m.input().full_name(),
                if m.is_server_streaming() {
                    "stream "
                } else {
                    ""
                },
                m.output().full_name(),
            ));
        }
    }
    for msg in pool.all_messages() {
        if !msg.full_name().starts_with("runtime.v1.") {
            continue;
        }
        for f in msg.fields() {
            let opts = f.options();
            let flag = |name: &str| {
                opts.get_field_by_name(name)
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false)
            };
            lines.push(format!(
                "field {}.{} = {} {:?} {} json={} redact={} deprecated={}",
                msg.full_name(),
                f.name(),
                f.number(),
                f.cardinality(),
                kind_name(&f.kind()),
                f.json_name(),
                flag("debug_redact"),
                flag("deprecated"),
            ));
        }
    }
    for e in pool.all_enums() {
        if !e.full_name().starts_with("runtime.v1.") {
            continue;
        }
        for v in e.values() {
            lines.push(format!(
                "enum {}.{} = {}",
                e.full_name(),
                v.name(),
                v.number()
            ));
        }
    }
    lines.sort();
    lines.join("\n")
}

/// 64-bit FNV-1a: enough to notice any change, no extra dependency.
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Pins the whole schema. The fingerprint was taken when this file's canonical schema was checked
/// to be identical to that of cri-api main's api.proto at 791729b (minus go_package). If it fails
/// after a deliberate upgrade, compare against the new upstream file again before updating it.
#[test]
fn whole_schema_fingerprint() {
    let schema = canonical_schema(&pool());
    let lines = schema.lines().count();
    let hash = fnv1a64(schema.as_bytes());
    println!("{lines} lines, fingerprint {hash:#018x}");
    assert_eq!(
        (lines, hash),
        (676, 0x97a3_6d79_1534_eeb3),
        "schema changed"
    );
}
