"""A CRI client on Python's grpcio, for the end-to-end tests (tests/tests/e2e/grpc_clients.rs).

Compiles crius's api.proto with grpc_tools, connects to the socket the way an ordinary grpcio
user does (target "unix://PATH", optionally with an explicit default authority), and calls
Version, RunPodSandbox, ListContainers, StopPodSandbox and RemovePodSandbox. Prints one JSON
object with what it saw; a failed call is reported as {"error": [code, details]} under its name
so that the Rust test can say which call failed and how.

usage: cri_client.py PROTO_DIR SOCKET AUTHORITY|- POD_NAME LOG_DIR
"""

import atexit
import json
import os
import shutil
import sys
import tempfile

import grpc
from grpc_tools import protoc


def compile_proto(proto_dir):
    out = tempfile.mkdtemp(prefix="crius-py-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    rc = protoc.main(
        [
            "protoc",
            "-I" + proto_dir,
            "--python_out=" + out,
            "--grpc_python_out=" + out,
            os.path.join(proto_dir, "runtime/v1/api.proto"),
        ]
    )
    if rc != 0:
        sys.exit("protoc failed on " + proto_dir)
    sys.path.insert(0, out)
    from runtime.v1 import api_pb2, api_pb2_grpc  # noqa: E402

    return api_pb2, api_pb2_grpc


def call(results, name, fn):
    try:
        value = fn()
        results[name] = value
        return value
    except grpc.RpcError as e:
        results[name] = {"error": [e.code().name, e.details()]}
        return None


def main():
    proto_dir, socket, authority, pod_name, log_dir = sys.argv[1:6]
    api, stubs = compile_proto(proto_dir)
    options = []
    if authority != "-":
        options.append(("grpc.default_authority", authority))
    channel = grpc.insecure_channel("unix://" + socket, options=options)
    runtime = stubs.RuntimeServiceStub(channel)
    results = {}

    call(
        results,
        "version",
        lambda: runtime.Version(api.VersionRequest(version="v1"), timeout=10).runtime_name,
    )
    config = api.PodSandboxConfig(
        metadata=api.PodSandboxMetadata(
            name=pod_name, uid="uid-" + pod_name, namespace="crius-e2e", attempt=0
        ),
        log_directory=log_dir,
        labels={"pod": pod_name},
        linux=api.LinuxPodSandboxConfig(
            security_context=api.LinuxSandboxSecurityContext(
                namespace_options=api.NamespaceOption(
                    network=api.POD, pid=api.POD, ipc=api.POD
                )
            )
        ),
    )
    pod = call(
        results,
        "run_pod_sandbox",
        lambda: runtime.RunPodSandbox(
            api.RunPodSandboxRequest(config=config), timeout=60
        ).pod_sandbox_id,
    )
    call(
        results,
        "list_containers",
        lambda: len(runtime.ListContainers(api.ListContainersRequest(), timeout=10).containers),
    )
    if pod:
        call(
            results,
            "list_pods",
            lambda: [
                p.id
                for p in runtime.ListPodSandbox(
                    api.ListPodSandboxRequest(
                        filter=api.PodSandboxFilter(id=pod)
                    ),
                    timeout=10,
                ).items
            ],
        )
        call(
            results,
            "stop_pod_sandbox",
            lambda: runtime.StopPodSandbox(
                api.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=60
            )
            is not None,
        )
        call(
            results,
            "remove_pod_sandbox",
            lambda: runtime.RemovePodSandbox(
                api.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=60
            )
            is not None,
        )
    channel.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
