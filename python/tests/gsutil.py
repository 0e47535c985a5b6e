"""Helpers of the Python package's tests: a real gradsnap-server child process, a real etcd
member, throwaway TLS certificates from the openssl command, a byte flipped in a stored
segment.

The binaries come from the environment (python/CMakeLists.txt sets them for ctest):
GRADSNAP_SERVER_BIN (gradsnap-server) and GRADSNAP_CLI_BIN (gradsnap)."""
import glob
import os
import shutil
import signal
import socket
import subprocess
import time

SERVER_BIN = os.environ.get("GRADSNAP_SERVER_BIN", "build/bin/gradsnap-server")
CLI_BIN = os.environ.get("GRADSNAP_CLI_BIN", "build/bin/gradsnap")


def free_port():
    """A TCP port on 127.0.0.1 free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port, name):
    """The value of Prometheus metric `name` (summed over its labels) at 127.0.0.1:port."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Server:
    """gradsnap-server --data-dir DIR --listen LISTEN (default 127.0.0.1:0) [extra...], ready once it printed
    its "listening on HOST:PORT" line (30 s at most); stopped with SIGTERM, then SIGKILL."""

    def __init__(self, data_dir, extra=(), listen="127.0.0.1:0"):
        self.data_dir = data_dir
        self.log = open(os.path.join(os.path.dirname(data_dir.rstrip("/")) or ".",
                                     os.path.basename(data_dir.rstrip("/")) + ".log"), "wb")
        self.proc = subprocess.Popen(
            [SERVER_BIN, "--data-dir", data_dir, "--listen", listen, *extra],
            stdout=subprocess.PIPE, stderr=self.log)
        deadline = time.monotonic() + 30
        line = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line or b"listening on " in line:
                break
        if b"listening on " not in line:
            self.stop()
            raise RuntimeError(f"gradsnap-server did not start: {line!r}, log {self.log.name}")
        self.address = line.split(b"listening on ")[1].split()[0].decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


class Etcd:
    """One real etcd member (Debian's etcd-server) on loopback ports, its data in `data_dir`,
    ready once `etcdctl endpoint health` passes (a minute at most); stopped with SIGKILL.
    Raises unittest.SkipTest where etcd or etcdctl is not installed
    (scripts/install-deps.sh installs them)."""

    def __init__(self, data_dir, tls_dir=None):
        """tls_dir: a make_tls() directory; etcd then serves https:// and asks every client
        for a certificate of its CA (client.pem), and `endpoint` is https://HOST:PORT."""
        import unittest
        for b in ("etcd", "etcdctl"):
            if shutil.which(b) is None:
                raise unittest.SkipTest(f"{b} is not installed (scripts/install-deps.sh)")
        scheme = "https" if tls_dir else "http"
        client = f"{scheme}://127.0.0.1:{free_port()}"
        peer = f"http://127.0.0.1:{free_port()}"
        self.endpoint = client if tls_dir else client[len("http://"):]
        tls, ctl_tls = [], []
        if tls_dir:
            t = lambda n: os.path.join(tls_dir, n)
            tls = ["--cert-file", t("server.pem"), "--key-file", t("server.key"),
                   "--client-cert-auth", "--trusted-ca-file", t("ca.pem")]
            ctl_tls = ["--cacert", t("ca.pem"), "--cert", t("client.pem"),
                       "--key", t("client.key")]
        self.log = open(data_dir.rstrip("/") + ".log", "wb")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "m0", "--data-dir", data_dir, "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"m0={peer}",
             "--initial-cluster-state", "new", "--logger", "zap", "--log-outputs", "stderr",
             *tls],
            stdout=self.log, stderr=self.log)
        for _ in range(120):  # 120 x (check + 0.5 s)
            if self.proc.poll() is not None:
                break
            r = subprocess.run(["etcdctl", "--endpoints", self.endpoint, *ctl_tls,
                                "--command-timeout=2s", "endpoint", "health"],
                               capture_output=True, timeout=10)
            if r.returncode == 0:
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy, log {self.log.name}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


class Cluster:
    """A real etcd member (Etcd) and `nodes` gradsnap-servers registered in it (--etcd,
    --advertise), all under directory `tmp`; a context manager that stops them all."""

    def __init__(self, tmp, nodes=2):
        self.etcd = Etcd(os.path.join(tmp, "etcd"))
        self.servers = []
        try:
            for i in range(nodes):
                self.servers.append(self._start(os.path.join(tmp, f"node{i}"),
                                                f"127.0.0.1:{free_port()}"))
        except BaseException:
            self.stop()
            raise

    def _start(self, data_dir, addr):
        return Server(data_dir, ["--etcd", self.etcd.endpoint, "--advertise", addr], listen=addr)

    def restart(self, i):
        """Starts node i again (after servers[i].stop()) on its data and address."""
        self.servers[i] = self._start(self.servers[i].data_dir, self.servers[i].address)

    def stop(self):
        for srv in self.servers:
            srv.stop()
        self.etcd.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def make_tls(d):
    """ca.pem, server.pem/.key (for localhost and 127.0.0.1), client.pem/.key under d."""
    script = (
        "set -e; openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=py-test-ca "
        "-keyout ca.key -out ca.pem; "
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext; "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key "
        "-out server.csr; "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile san.ext -out server.pem; "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=py -keyout client.key -out client.csr; "
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-out client.pem")
    subprocess.run(["sh", "-c", script], cwd=d, check=True, capture_output=True)


def token(job, secret_file):
    """The bearer token of `job` (gradsnap token JOB --secret-file F)."""
    r = subprocess.run([CLI_BIN, "token", job, "--secret-file", secret_file], check=True,
                       capture_output=True, text=True)
    return r.stdout.strip()


def flip_segment_bytes(store, job, step):
    """Flips byte 20 (a chunk record's header) of every segment file of (job, step) in a store
    directory; returns how many files it changed."""
    n = 0
    for seg in glob.glob(os.path.join(store, "segments", job, f"{step:020d}", "*.seg")):
        with open(seg, "r+b") as f:
            f.seek(20)
            b = f.read(1)
            f.seek(20)
            f.write(bytes([b[0] ^ 0x40]))
        n += 1
    return n
