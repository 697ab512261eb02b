"""A minimal client of the moonkv master protocol, written from docs/protocol.md alone.

It exists to prove the protocol document is enough to speak to the master from another
language, and to drive the master in the event-stream peer tests.
"""

import itertools
import socket
import struct

import msgpack

KIND_REQUEST, KIND_RESPONSE, KIND_HELLO = 1, 2, 3
OPS = {
    "Ping": 1, "MountSegment": 2, "ReMountSegment": 3, "UnmountSegment": 4,
    "ExistKey": 10, "BatchExistKey": 11, "GetReplicaList": 12, "BatchGetReplicaList": 13,
    "RevalidateReplicas": 15, "PutStart": 20, "PutEnd": 21, "PutRevoke": 22,
    "BatchPutStart": 23, "BatchPutEnd": 24, "UpsertStart": 26, "UpsertEnd": 27,
    "Remove": 40, "BatchRemove": 41, "RemoveByRegex": 42, "RemoveAll": 43,
}
REPLICA_TYPE_ALL = 4


class MoonkvError(Exception):
    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Client:
    def __init__(self, addr, client_id=(1, 1)):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ids = itertools.count(1)
        self.client_id = list(client_id)
        self._send(KIND_HELLO, 0, 0, ["moonkv", 1, "python-peer"])
        code, body = self._recv()
        if code != 0:
            raise MoonkvError(code, body)

    def _send(self, kind, request_id, code, body):
        payload = msgpack.packb(body, use_bin_type=True)
        header = struct.pack(">IBQi", 13 + len(payload), kind, request_id, code)
        self.sock.sendall(header + payload)

    def _read_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("master closed the connection")
            buf += chunk
        return buf

    def _recv(self):
        length, kind, _request_id, code = struct.unpack(">IBQi", self._read_exact(17))
        body = msgpack.unpackb(self._read_exact(length - 13), raw=False)
        return code, body

    def call(self, op, *args):
        self._send(KIND_REQUEST, next(self.ids), OPS[op], list(args))
        code, body = self._recv()
        if code != 0:
            raise MoonkvError(code, body)
        return body

    # Convenience wrappers -------------------------------------------------------------------

    def mount(self, segment_id, name, size, base=0x10000000):
        segment = [[9, segment_id], name, base, size, "127.0.0.1:1", "tcp", "h"]
        self.call("MountSegment", segment, self.client_id)

    @staticmethod
    def config(replica_num=1):
        # replica_num, soft_pin_action, soft_pin_ttl_ms, with_hard_pin, preferred_segments, group_ids
        return [replica_num, 0, None, False, [], None]

    def put(self, tenant, key, size, upsert=False):
        start, end = ("UpsertStart", "UpsertEnd") if upsert else ("PutStart", "PutEnd")
        replicas = self.call(start, self.client_id, tenant, key, size, self.config())
        ids = [r[0] for r in replicas]
        self.call(end, self.client_id, tenant, key, REPLICA_TYPE_ALL, ids, None)
        return ids

    def put_start(self, tenant, key, size):
        replicas = self.call("PutStart", self.client_id, tenant, key, size, self.config())
        return [r[0] for r in replicas]

    def put_revoke(self, tenant, key, ids):
        self.call("PutRevoke", self.client_id, tenant, key, REPLICA_TYPE_ALL, ids)
