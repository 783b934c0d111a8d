"""TLS on every wire, once each: ``amqps://`` to a private RabbitMQ node,
``sslmode=verify-full`` to a private Postgres cluster, both started and stopped here
with a certificate authority made here, and https to a model endpoint through an
egress proxy. The machine's own broker and database are not
touched (the private node has its own node name, config file, data dir and ports;
the private cluster its own data dir, port and socket directory)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from casetrail.adapters.bus.connection import connect
from casetrail.adapters.bus.deliveries import Subscription
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.store import create_pool
from casetrail.adapters.store.migrate import migrate
from casetrail.config import Settings
from casetrail.engine.chat import UserMessage
from casetrail.errors import ModelUnavailable, scrub
from casetrail.providers import ModelFactory
from casetrail.providers.clients import ModelClients, PoolSettings
from casetrail.providers.openai_compat import OpenAIChatModel
from tests.support.fake_llm import fake_llm, openai_turn
from tests.support.helpers import wait_until
from tests.support.stack import (
    free_port,
    port_open,
)

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


@dataclass(frozen=True)
class Authority:
    ca: Path
    certificate: Path
    key: Path
    stranger: Path
    """Another authority's certificate: trusting it instead must fail."""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _authority(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(_name(common_name))
        .issuer_name(_name(common_name)).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
    return key, certificate


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    """A CA, a server certificate it signed for localhost and 127.0.0.1, and another
    CA that signed nothing of ours."""
    folder = tmp_path_factory.mktemp("tls")
    ca_key, ca = _authority("casetrail test CA")
    _, stranger = _authority("somebody else's CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .sign(ca_key, hashes.SHA256()))
    paths = Authority(folder / "ca.pem", folder / "server.pem", folder / "server.key",
                      folder / "stranger.pem")
    paths.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.stranger.write_bytes(stranger.public_bytes(serialization.Encoding.PEM))
    paths.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.TraditionalOpenSSL,
                                            serialization.NoEncryption()))
    return paths


# -- a private RabbitMQ node with a TLS listener only ---------------------------------------

@pytest.fixture(scope="module")
def tls_broker(authority: Authority, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[int]:
    """Its own node name, config file (no plain listener; the machine's config would
    bind 5672), environment file, data and log dirs, TLS and distribution ports."""
    folder = tmp_path_factory.mktemp("broker")
    port, node = free_port(), f"casetrail-tls-{uuid.uuid4().hex[:8]}@localhost"
    (folder / "rabbitmq.conf").write_text(
        "listeners.tcp = none\n"
        f"listeners.ssl.default = 127.0.0.1:{port}\n"
        f"ssl_options.cacertfile = {authority.ca}\n"
        f"ssl_options.certfile = {authority.certificate}\n"
        f"ssl_options.keyfile = {authority.key}\n"
        "ssl_options.verify = verify_none\n"
        "ssl_options.fail_if_no_peer_cert = false\n")
    (folder / "rabbitmq-env.conf").write_text("")
    env = {**os.environ, "RABBITMQ_NODENAME": node,
           "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
           "RABBITMQ_CONF_ENV_FILE": str(folder / "rabbitmq-env.conf"),
           "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
           "RABBITMQ_LOG_BASE": str(folder / "log"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "plugins"),
           "RABBITMQ_DIST_PORT": str(free_port()),
           # Small: one scheduler, no busy-waiting, beside the machine's own broker.
           "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+S 1 +sbwt none +sbwtdcpu none"}
    server = subprocess.Popen([str(RABBITMQ_BIN / "rabbitmq-server")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        asyncio.run(wait_until(lambda: port_open(port), timeout=60, interval=0.3))
        yield port
    finally:
        subprocess.run([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node, "stop"], env=env,
                       capture_output=True, timeout=60, check=False)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


async def test_the_bus_over_amqps_verifies_the_broker(authority: Authority,
                                                       tls_broker: int) -> None:
    """A confirmed publish and a consume over amqps://, the broker's certificate checked
    against the CA; another CA's trust, or no TLS at all, gets no connection."""
    url = f"amqps://guest:guest@localhost:{tls_broker}/?cafile={authority.ca}"
    connection = await connect(url, "casetrail-tls-test")
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        received: asyncio.Queue[bytes] = asyncio.Queue()
        subscription = Subscription(channel, queue.name,
                                    lambda m: received.put_nowait(m.body), no_ack=True)
        await subscription.start()
        publisher = await Publisher.open(connection)
        await publisher.publish("", queue.name, b"over TLS")  # confirmed by the broker
        assert await asyncio.wait_for(received.get(), 10) == b"over TLS"
        await subscription.cancel()
    finally:
        await connection.close()
    for refused in (f"amqps://guest:guest@localhost:{tls_broker}/?cafile={authority.stranger}",
                    f"amqp://guest:guest@localhost:{tls_broker}/"):
        with pytest.raises(Exception) as caught:
            await asyncio.wait_for(_connect_once(refused), 15)
        assert not isinstance(caught.value, AssertionError)


async def _connect_once(url: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(url)
    await connection.close()
    raise AssertionError(f"connected to {url}")


# -- a private Postgres cluster that accepts TLS only ------------------------------------

@pytest.fixture(scope="module")
def tls_postgres(authority: Authority) -> Iterator[int]:
    """``initdb`` under ``runuser -u postgres`` (it refuses root), its own data dir, port
    and socket dir; ``ssl = on`` and pg_hba accepting ``hostssl`` only."""
    bindir = Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                 check=True).stdout.strip())
    # Outside pytest's own temporary tree, which only root may enter.
    folder = Path(tempfile.mkdtemp(prefix="casetrail-tls-postgres-"))
    for path in (authority.certificate, authority.key):
        shutil.copy(path, folder / path.name)
    shutil.chown(folder, "postgres")
    for item in folder.iterdir():
        shutil.chown(item, "postgres")
    (folder / "server.key").chmod(0o600)
    data, port = folder / "data", free_port()

    def as_postgres(*args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       capture_output=True, timeout=120)

    as_postgres(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"listen_addresses = '127.0.0.1'\nport = {port}\n"
                   f"unix_socket_directories = '{folder}'\nssl = on\n"
                   f"ssl_cert_file = '{folder / 'server.pem'}'\n"
                   f"ssl_key_file = '{folder / 'server.key'}'\n"
                   "shared_buffers = 16MB\nmax_connections = 20\n")
    (data / "pg_hba.conf").write_text("hostssl all all 127.0.0.1/32 trust\n"
                                      "host all all 127.0.0.1/32 reject\n"
                                      "local all all trust\n")
    as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w",
                "start")
    try:
        yield port
    finally:
        as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-w", "-m", "fast", "stop")
        shutil.rmtree(folder, ignore_errors=True)


async def test_postgres_with_sslmode_verify_full(authority: Authority,
                                                 tls_postgres: int) -> None:
    """Migrations and a pool over verify-full (the server's name checked against its
    certificate, signed by the trusted CA); another CA, or no TLS, gets nothing."""
    base = f"postgresql://postgres@localhost:{tls_postgres}/casetrail"
    url = f"{base}?sslmode=verify-full&sslrootcert={authority.ca}"
    applied = await migrate(url)
    assert applied and applied[0].startswith("001_")
    pool = await create_pool(url, max_size=1)
    try:
        assert await pool.fetchval(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
        assert await pool.fetchval("SELECT count(*) FROM event_log") == 0
    finally:
        await pool.close()
    with pytest.raises(asyncpg.exceptions.InvalidAuthorizationSpecificationError):
        await asyncpg.connect(f"{base}?sslmode=disable")
    with pytest.raises(OSError, match=r"certificate verify failed|CERTIFICATE_VERIFY_FAILED"):
        await asyncpg.connect(f"{base}?sslmode=verify-full&sslrootcert={authority.stranger}")



# -- a model endpoint over https, through an egress proxy -----------------------------------

@dataclass
class ConnectProxy:
    """An egress proxy that only tunnels (CONNECT): keeps the request line of each
    tunnel asked for and every byte it carried."""

    asked: list[bytes] = field(default_factory=list)
    carried: bytearray = field(default_factory=bytearray)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.asked.append(head.split(b"\r\n", 1)[0])
        method, target, _ = head.split(b" ", 2)
        if method != b"CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        host, port = target.rsplit(b":", 1)
        upstream_reader, upstream = await asyncio.open_connection(host.decode(), int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    self.carried += data
                    sink.write(data)
                    await sink.drain()
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, upstream), pipe(upstream_reader, writer),
                             return_exceptions=True)


async def test_model_requests_go_through_the_egress_proxy_in_verified_tls(
    authority: Authority,
) -> None:
    """An https endpoint is reached through CONNECT: the proxy carries only ciphertext
    (no key, no conversation), the endpoint's certificate is checked against the
    configured authorities (another CA: refused), and a loopback endpoint goes direct."""
    proxy = ConnectProxy()
    listening = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
    proxy_url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}"
    trusted = ModelClients(PoolSettings(proxy=proxy_url, ca_file=str(authority.ca)))
    strangers = ModelClients(PoolSettings(proxy=proxy_url, ca_file=str(authority.stranger)))
    secret = "sk-tunnelled-key-0123456789"
    try:
        async with fake_llm((authority.certificate, authority.key)) as endpoint:
            endpoint.script = [openai_turn("through the tunnel")]
            model = OpenAIChatModel("gpt-test", trusted.client(
                "openai", f"{endpoint.base_url}/v1", secret))
            turn = await model.request([UserMessage("the applicant's income")], [])
            assert turn.text == "through the tunnel"
            port = endpoint.base_url.rsplit(":", 1)[1]
            assert proxy.asked == [f"CONNECT localhost:{port} HTTP/1.1".encode()]
            assert endpoint.headers[0]["authorization"] == f"Bearer {secret}"
            assert secret.encode() not in proxy.carried
            assert b"income" not in proxy.carried and len(proxy.carried) > 1000
            refused = OpenAIChatModel("gpt-test", strangers.client(
                "openai", f"{endpoint.base_url}/v1", secret))
            with pytest.raises(ModelUnavailable, match=r"(?i)certificate verify failed"):
                await refused.request([UserMessage("hello")], [])
        async with fake_llm() as loopback:
            loopback.script = [openai_turn("direct")]
            tunnels = len(proxy.asked)
            direct = OpenAIChatModel("gpt-test", trusted.client(
                "openai", f"{loopback.base_url}/v1", secret))
            assert (await direct.request([UserMessage("hello")], [])).text == "direct"
            assert len(proxy.asked) == tunnels
    finally:
        await trusted.aclose()
        await strangers.aclose()
        listening.close()


def test_the_proxy_setting_reaches_the_clients_and_must_be_a_proxy_url() -> None:
    configured = Settings(_env_file=None, model_proxy="http://egress:s3cret@proxy.internal:3128",
                          model_ca_file="/etc/ssl/internal-ca.pem")
    pool = ModelFactory(configured).clients.pool
    assert pool.proxy == "http://egress:s3cret@proxy.internal:3128"
    assert pool.ca_file == "/etc/ssl/internal-ca.pem"
    assert "s3cret" not in repr(configured)
    with pytest.raises(ValueError, match="model_proxy must be"):
        Settings(_env_file=None, model_proxy="socks5://proxy.internal:1080")
    assert scrub("Cannot connect to http://egress:s3cret@proxy.internal:3128") == \
        "Cannot connect to http://[redacted]@proxy.internal:3128"
