"""The Python package over an embedded store and a real gradsnap-server (no PyTorch needed):
every dtype round trip, restore into caller buffers, "latest", ranged reads, damage found, bad
arguments, tokens and TLS; cluster mode through a real etcd (ClusterTest, ctest label etcd). Run by ctest (python/CMakeLists.txt) as python3 -m unittest."""
import os
import shutil
import tempfile
import threading
import unittest

import numpy as np

import gradsnap
import gsutil


def every_dtype():
    """One array of each dtype the format knows (bf16 as its bits in uint16), by gradsnap name."""
    rng = np.random.default_rng(7)
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "bf16": rng.integers(0, 1 << 16, size=(2, 3, 4), dtype=np.uint16),
        "f16": rng.standard_normal(17).astype(np.float16),
        "f64": rng.standard_normal((4, 4)),
        "i32": rng.integers(-2**31, 2**31, size=9, dtype=np.int32),
        "i64": rng.integers(-2**62, 2**62, size=(2, 2), dtype=np.int64),
        "u8": rng.integers(0, 256, size=1000, dtype=np.uint8),
    }


def check_read_ranges(test, c):
    """read_ranges in both modes against the payload's bytes: regions out of order,
    overlapping, across the tensor boundary, empty, the whole payload; past the end raises."""
    a = np.random.default_rng(3).standard_normal(700_001).astype(np.float32)
    b = np.arange(5000, dtype=np.int64)
    c.save("rr", 1, {"a": a, "b": b})
    payload = a.tobytes() + b.tobytes()
    spans = [(len(payload) - 1, 1), (0, 64), (10, 2_800_000), (a.nbytes - 100, 300),
             (2_799_999, 17), (5, 0), (0, len(payload)), (1_234_567, 1)]
    for whole in (True, False):
        for group in (spans, spans[2:4], [spans[1]]):
            outs = [np.full(n, 0xAA, np.uint8) for _, n in group]
            c.read_ranges("rr", 1, 0, [(o, out) for (o, _), out in zip(group, outs)],
                          whole_shard=whole)
            for (o, n), out in zip(group, outs):
                test.assertEqual(out.tobytes(), payload[o:o + n], (whole, o, n))
        with test.assertRaises(gradsnap.OutOfRange):
            c.read_ranges("rr", 1, 0, [(len(payload) - 4, bytearray(8))], whole_shard=whole)
    with test.assertRaises(TypeError):
        c.read_ranges("rr", 1, 0, [(0, b"read-only")])
    with test.assertRaises(TypeError):
        c.read_ranges("rr", 1, 0, [0, bytearray(4)])
    with test.assertRaises(ValueError):
        c.read_ranges("rr", 1, 0, [(-1, bytearray(4))])


def vm_flags(addr):
    """The VmFlags of the mapping holding address `addr` (/proc/self/smaps), as a list."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    return []


class TempDirCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gradsnap-py-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class EmbeddedTest(TempDirCase):
    def open(self):
        return gradsnap.open_dir(os.path.join(self.tmp, "store"))

    def test_every_dtype_round_trips(self):
        arrays = every_dtype()
        with self.open() as c:
            c.save("job", 1, arrays, dtypes={"bf16": "bf16"})
            back = c.restore("job", 1)
            shown = c.show("job", 1)["shards"][0]["tensors"]
        self.assertEqual(list(back), list(arrays))
        self.assertEqual([t["dtype"] for t in shown], list(arrays))
        for name, a in arrays.items():
            self.assertEqual(back[name].dtype, np.dtype(gradsnap.DTYPES[name]), name)
            self.assertEqual(back[name].shape, a.shape, name)
            self.assertEqual(back[name].tobytes(), a.tobytes(), name)

    def test_other_buffers_and_raw_bytes(self):
        with self.open() as c:
            c.save("job", 1, {"m": memoryview(b"\x01\x02\x03\x04"), "b": bytearray(b"xyz"),
                              "h": bytes(8)}, dtypes={"h": "bf16"})
            back = c.restore("job", 1)
            tensors = {t["name"]: t for t in c.show("job", 1)["shards"][0]["tensors"]}
        self.assertEqual(back["m"].tobytes(), b"\x01\x02\x03\x04")
        self.assertEqual(back["b"].tobytes(), b"xyz")
        self.assertEqual((tensors["h"]["dtype"], tensors["h"]["shape"]), ("bf16", (4,)))

    def test_restore_into_caller_buffers(self):
        arrays = every_dtype()
        with self.open() as c:
            c.save("job", 3, arrays, dtypes={"bf16": "bf16"})
            out = {n: np.zeros_like(a) for n, a in arrays.items()}
            raw = bytearray(arrays["u8"].nbytes)
            back = c.restore("job", 3, out={**out, "u8": raw})
            for name, a in arrays.items():
                if name != "u8":
                    self.assertIs(back[name], out[name])  # filled in place, no new array
                    self.assertEqual(out[name].tobytes(), a.tobytes(), name)
            self.assertIs(back["u8"], raw)
            self.assertEqual(bytes(raw), arrays["u8"].tobytes())
            # Only some tensors; a buffer of the wrong size or a read-only one is refused.
            self.assertEqual(list(c.restore("job", 3, names=["f64"])), ["f64"])
            with self.assertRaises(ValueError):
                c.restore("job", 3, out={"f32": np.zeros(3, np.float32)})
            with self.assertRaises(TypeError):
                c.restore("job", 3, out={"u8": bytes(1000)})
            with self.assertRaises(gradsnap.NotFound):
                c.restore("job", 3, out={"nosuch": np.zeros(1)})

    def test_restore_arrays_are_advised_base_pages(self):
        """The arrays restore makes are fresh memory the restore fills: advised to base pages
        (smaps VmFlags "nh"), not the huge pages NumPy advises for arrays of 4 MiB and more
        (docs/performance.md, "Restore into fresh memory"); contents exact."""
        if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
            self.skipTest("no transparent huge pages on this kernel")
        a = np.random.default_rng(5).standard_normal(3 << 20).astype(np.float32)  # 12 MiB
        with self.open() as c:
            c.save("job", 1, {"a": a, "b": np.arange(10)})
            back = c.restore("job", 1)
        self.assertEqual(back["a"].tobytes(), a.tobytes())
        self.assertIn("nh", vm_flags(back["a"].ctypes.data + (8 << 20)))

    def test_latest_is_the_newest_committed_step(self):
        with self.open() as c:
            for step in (5, 20, 10):
                c.save("job", step, {"s": np.array([step], np.int64)})
            # A pending checkpoint (1 of 2 ranks) is not "latest" and not listed.
            c.save("job", 30, {"s": np.array([30], np.int64)}, rank=0, world_size=2)
            self.assertEqual([i["step"] for i in c.list("job")], [5, 10, 20])
            self.assertEqual([i["state"] for i in c.list("job", pending=True)][-1], "pending")
            self.assertEqual(int(c.restore("job", "latest")["s"][0]), 20)
            self.assertEqual(c.verify("job"), 20)
            self.assertEqual(c.show("job")["step"], 20)
            c.delete("job", 20)
            self.assertEqual(int(c.restore("job")["s"][0]), 10)
            self.assertEqual(c.jobs(), ["job"])

    def test_ranged_read(self):
        a = np.arange(100, dtype=np.int32)
        with self.open() as c:
            c.save("job", 1, {"a": a, "b": np.arange(3, dtype=np.float64)})
            self.assertEqual(c.read_range("job", 1, 0, 40, 8).tobytes(), a[10:12].tobytes())
            out = bytearray(4)
            self.assertIs(c.read_range("job", 1, 0, 396, 4, out), out)
            self.assertEqual(bytes(out), a[99:].tobytes())
            with self.assertRaises(gradsnap.OutOfRange):
                c.read_range("job", 1, 0, 420, 8)

    def test_read_ranges(self):
        with self.open() as c:
            check_read_ranges(self, c)

    def test_flipped_byte_is_data_loss(self):
        store = os.path.join(self.tmp, "store")
        with gradsnap.open_dir(store) as c:
            c.save("job", 1, {"w": np.ones(100000, np.float32)})
        self.assertGreater(gsutil.flip_segment_bytes(store, "job", 1), 0)
        with gradsnap.open_dir(store) as c:
            with self.assertRaises(gradsnap.DataLoss) as e:
                c.verify("job", 1)
            self.assertEqual(e.exception.code, "DATA_LOSS")
            self.assertIsInstance(e.exception, gradsnap.Error)
            with self.assertRaises(gradsnap.DataLoss):
                c.restore("job", 1)
            for whole in (True, False):
                with self.assertRaises(gradsnap.DataLoss):
                    c.read_ranges("job", 1, 0, [(0, np.empty(400000, np.uint8))],
                                  whole_shard=whole)

    def test_bad_arguments_raise(self):
        c = self.open()
        a = np.zeros(4, np.float32)
        with self.assertRaises(TypeError):
            c.save("job", 1, [a])  # not a mapping
        with self.assertRaises(TypeError):
            c.save("job", 1, {"a": [1.0, 2.0]})  # not a buffer
        with self.assertRaises(TypeError):
            c.save("job", 1, {"a": np.zeros((4, 4), np.float32)[:, 1]})  # not contiguous
        with self.assertRaises(TypeError):
            c.save("job", 1, {"a": np.zeros(4, np.int8)})  # no gradsnap dtype
        with self.assertRaises(ValueError):
            c.save("job", 1, {"a": a}, dtypes={"a": "f128"})
        with self.assertRaises(TypeError):
            c.save("job", "one", {"a": a})
        with self.assertRaises(TypeError):
            c.save(7, 1, {"a": a})
        with self.assertRaises(gradsnap.InvalidArgument):
            c.save("bad job/name", 1, {"a": a})
        with self.assertRaises(gradsnap.InvalidArgument):
            c.save("job", -1, {"a": a})
        with self.assertRaises(gradsnap.InvalidArgument):
            c.save("job", 9, {"a": a}, rank=3, world_size=2)
        with self.assertRaises(ValueError):
            c.restore("job", "newest")
        with self.assertRaises(gradsnap.NotFound):
            c.restore("nosuchjob", "latest")
        with self.assertRaises(gradsnap.NotFound):
            c.show("nosuchjob", 1)
        with self.assertRaises(gradsnap.NotFound):
            c.verify("nosuchjob", 1)
        with self.assertRaises(gradsnap.NotFound):
            c.delete("nosuchjob", 1)
        self.assertEqual(c.list("nosuchjob"), [])
        c.save("job", 1, {"a": a})
        with self.assertRaises(gradsnap.NotFound):
            c.restore("job", 1, rank=1)
        with self.assertRaises(gradsnap.AlreadyExists):
            c.save("job", 1, {"a": np.zeros(5, np.float32)})  # same shard, another spec
        c.close()
        c.close()
        self.assertTrue(c.closed)
        with self.assertRaises(ValueError):
            c.restore("job", 1)
        with self.assertRaises(ValueError):
            c.list("job")
        with self.assertRaises(TypeError):
            gradsnap.open_dir(None)
        with self.assertRaises(ValueError):
            gradsnap.connect(servers="127.0.0.1:1", etcd="http://127.0.0.1:2379")
        with self.assertRaises(ValueError):
            gradsnap.connect()
        with self.assertRaises(gradsnap.InvalidArgument):
            gradsnap.connect(etcd="127.0.0.1:1", min_replicas=0)
        with self.assertRaises(gradsnap.Unavailable):  # nothing listens there
            gradsnap.connect(etcd="127.0.0.1:1", timeout_ms=1000)
        with self.assertRaises(gradsnap.InvalidArgument):
            gradsnap.connect(servers="no-port")

    def test_threads_save_at_once(self):
        # The GIL is released during I/O: several threads save shards of one checkpoint.
        with self.open() as c:
            arrays = [np.full(1 << 18, r, np.float32) for r in range(4)]
            threads = [threading.Thread(target=c.save, args=("job", 1, {"w": arrays[r]}, r, 4))
                       for r in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for r in range(4):
                self.assertEqual(c.restore("job", 1, r)["w"].tobytes(), arrays[r].tobytes())


class ServerTest(TempDirCase):
    def test_round_trip_and_tokens(self):
        secret = os.path.join(self.tmp, "secret")
        with open(secret, "w") as f:
            f.write("0123456789abcdef0123456789abcdef\n")
        srv = gsutil.Server(os.path.join(self.tmp, "data"), ["--auth-secret-file", secret])
        try:
            arrays = every_dtype()
            tok = gsutil.token("job", secret)
            with gradsnap.connect(servers=[srv.address], token=tok) as c:
                c.health()
                c.save("job", 1, arrays, dtypes={"bf16": "bf16"})
                out = {"f64": np.empty((4, 4))}
                back = c.restore("job", "latest", out=out)
                self.assertIs(back["f64"], out["f64"])
                for name, a in arrays.items():
                    self.assertEqual(back[name].tobytes(), a.tobytes(), name)
                self.assertEqual(c.verify("job", 1), 1)
            with gradsnap.connect(servers=srv.address, max_attempts=1) as c:
                with self.assertRaises(gradsnap.Unauthenticated):
                    c.list("job")
            with gradsnap.connect(servers=srv.address, token=gsutil.token("other", secret),
                                  max_attempts=1) as c:
                with self.assertRaises(gradsnap.PermissionDenied):
                    c.restore("job", 1)
        finally:
            srv.stop()

    def test_read_ranges(self):
        srv = gsutil.Server(os.path.join(self.tmp, "data"))
        try:
            with gradsnap.connect(servers=srv.address) as c:
                check_read_ranges(self, c)
        finally:
            srv.stop()

    def test_restoring_many_small_tensors_reads_the_shard_once(self):
        # Small tensors share chunks: restored one by one, each tensor was a Read stream of its
        # own that read and checked its chunk again (2,000 tensors of 4 KiB: 31.8 s against
        # 0.05 s). restore() of many tensors takes one stream of the whole shard.
        port = gsutil.free_port()
        srv = gsutil.Server(os.path.join(self.tmp, "data"),
                            ["--metrics-listen", f"127.0.0.1:{port}"])
        try:
            rng = np.random.default_rng(11)
            arrays = {f"t{i:03d}": rng.standard_normal(1024).astype(np.float32)
                      for i in range(300)}
            payload = sum(a.nbytes for a in arrays.values())
            with gradsnap.connect(servers=srv.address) as c:
                c.save("small", 1, arrays)
                reads = gsutil.metric(port, "gradsnap_read_seconds_count")
                sent = gsutil.metric(port, "gradsnap_bytes_out_total")
                back = c.restore("small", 1)
                reads = gsutil.metric(port, "gradsnap_read_seconds_count") - reads
                sent = gsutil.metric(port, "gradsnap_bytes_out_total") - sent
                for name, a in arrays.items():
                    self.assertEqual(back[name].tobytes(), a.tobytes(), name)
                self.assertEqual(reads, 1)
                self.assertEqual(sent, payload)
                # A few tensors of the shard are still read alone (their digests checked).
                few = c.restore("small", 1, names=["t007", "t123"])
                self.assertEqual(few["t123"].tobytes(), arrays["t123"].tobytes())
        finally:
            srv.stop()

    def test_tls(self):
        gsutil.make_tls(self.tmp)
        p = lambda n: os.path.join(self.tmp, n)
        srv = gsutil.Server(p("data"), ["--tls-cert", p("server.pem"), "--tls-key",
                                        p("server.key"), "--tls-client-ca", p("ca.pem")])
        try:
            a = np.arange(1000, dtype=np.float32)
            with gradsnap.connect(servers=srv.address, tls_ca=p("ca.pem"),
                                  tls_cert=p("client.pem"), tls_key=p("client.key")) as c:
                c.save("job", 1, {"a": a})
                self.assertEqual(c.restore("job", 1)["a"].tobytes(), a.tobytes())
            # Plaintext, and TLS without the client certificate, are refused.
            for kw in ({}, {"tls_ca": p("ca.pem")}):
                with gradsnap.connect(servers=srv.address, max_attempts=1, timeout_ms=5000,
                                      **kw) as c:
                    with self.assertRaises(gradsnap.Error):
                        c.list("job")
        finally:
            srv.stop()


class ClusterTest(TempDirCase):
    """connect(etcd=...): a real etcd member and two gradsnap-servers registered in it."""

    def test_save_restore_through_etcd(self):
        with gsutil.Cluster(self.tmp, nodes=2) as cl:
            etcd, servers = cl.etcd, cl.servers
            arrays = every_dtype()
            with gradsnap.connect(etcd=etcd.endpoint, replicas=2, min_replicas=2) as c:
                c.save("job", 1, arrays, dtypes={"bf16": "bf16"})
                c.save("job", 2, {"w": arrays["f32"]})
                self.assertEqual([i["step"] for i in c.list("job")], [1, 2])
                back = c.restore("job", 1)
                for name, a in arrays.items():
                    self.assertEqual(back[name].tobytes(), a.tobytes(), name)
                self.assertEqual(c.verify("job", "latest"), 2)
                check_read_ranges(self, c)
            # Both nodes hold a copy (replicas=2): with either one stopped the other serves it.
            for i in range(2):
                servers[i].stop()
                with gradsnap.connect(etcd=etcd.endpoint, replicas=2) as c:
                    self.assertEqual(c.restore("job", 2)["w"].tobytes(),
                                     arrays["f32"].tobytes())
                cl.restart(i)

    def test_tls_towards_etcd(self):
        # etcd serving https:// and asking for client certificates; the nodes and the Python
        # client reach it with etcd_ca / etcd_cert / etcd_key.
        gsutil.make_tls(self.tmp)
        p = lambda n: os.path.join(self.tmp, n)
        etcd = gsutil.Etcd(p("etcd"), tls_dir=self.tmp)
        tls = {"etcd_ca": p("ca.pem"), "etcd_cert": p("client.pem"), "etcd_key": p("client.key")}
        servers = []
        try:
            for i in range(2):
                addr = f"127.0.0.1:{gsutil.free_port()}"
                servers.append(gsutil.Server(
                    p(f"node{i}"), ["--etcd", etcd.endpoint, "--advertise", addr,
                                    "--etcd-ca", tls["etcd_ca"], "--etcd-cert", tls["etcd_cert"],
                                    "--etcd-key", tls["etcd_key"]], listen=addr))
            a = np.arange(4096, dtype=np.float32)
            with gradsnap.connect(etcd=etcd.endpoint, replicas=2, **tls) as c:
                c.save("job", 1, {"a": a})
                self.assertEqual(c.restore("job", "latest")["a"].tobytes(), a.tobytes())
            # Without the client certificate, or without the CA, etcd refuses: one error.
            for kw in ({"etcd_ca": tls["etcd_ca"]}, {}):
                with self.assertRaises(gradsnap.Error):
                    gradsnap.connect(etcd=etcd.endpoint, timeout_ms=5000, **kw)
            with self.assertRaises(ValueError):
                gradsnap.connect(servers=servers[0].address, etcd_ca=tls["etcd_ca"])
        finally:
            for srv in servers:
                srv.stop()
            etcd.stop()

if __name__ == "__main__":
    unittest.main()
