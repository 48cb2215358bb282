"""Sends CRI requests whose bytes do not decode, as a client with a broken or mismatched
message definition would, for tests/tests/e2e/grpc_clients.rs. No proto is compiled: each request
is raw bytes on grpcio's generic unary call. Prints one JSON object: for each case, the
[code, details] crius answered, or "OK".

usage: malformed_requests.py SOCKET
"""

import json
import sys

import grpc


def field(number, payload):
    """A length-delimited field (wire type 2) holding payload (under 128 bytes)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


CASES = {
    # RunPodSandboxRequest.config.metadata.name: bytes that are not UTF-8
    "run_pod_sandbox_name_not_utf8": (
        "/runtime.v1.RuntimeService/RunPodSandbox",
        field(1, field(1, field(1, b"\xff\xfe"))),
    ),
    # RunPodSandboxRequest.config claims 16 bytes and has 1
    "run_pod_sandbox_truncated": (
        "/runtime.v1.RuntimeService/RunPodSandbox",
        b"\x0a\x10\x0a",
    ),
    # a varint that never ends
    "container_status_garbage": (
        "/runtime.v1.RuntimeService/ContainerStatus",
        b"\xff\xff\xff\xff",
    ),
    # ImageStatusRequest.image.image: bytes that are not UTF-8
    "image_status_not_utf8": (
        "/runtime.v1.ImageService/ImageStatus",
        field(1, field(1, b"\xc3\x28")),
    ),
    # only a field crius does not know: ignored, as protobuf wants
    "version_unknown_field": ("/runtime.v1.RuntimeService/Version", b"\xf8\x07\x01"),
}


def main():
    channel = grpc.insecure_channel("unix://" + sys.argv[1])
    seen = {}
    for name, (method, raw) in CASES.items():
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            call(raw, timeout=10)
            seen[name] = "OK"
        except grpc.RpcError as e:
            seen[name] = [e.code().name, e.details()]
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
