"""Where the landing zone and the lake live: a local folder or an object-storage prefix (SPEC section 1).

A :class:`Root` is one of the two roots as the user wrote it: a local path, a ``file://`` URI or
``s3://bucket/prefix``. :class:`Credentials` are the endpoint and keys of object storage, taken the ecosystem's
way (the standard AWS variables), and handed to each client in its own dialect: storage options for delta-rs,
``fs.s3a.*`` settings for Spark, a boto3 client for the driver's own objects. A :class:`Lake` holds the lake's
root and credentials, and answers the URI of every table and checkpoint under it.

No secret leaves this module in text: ``repr`` and ``str`` of every class here hide the keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from sluice.core.errors import ConfigError

OBJECT_SCHEMES = ("s3",)
# s3a:// is Hadoop's name for the same objects; sluice writes s3:// and lets Spark read it through S3A.
SCHEME_ALIASES = {"s3a": "s3"}


@dataclass(frozen=True)
class Root:
    """A storage root: ``scheme`` ``file`` with an absolute ``path``, or ``s3`` with a ``bucket`` and a key
    ``prefix`` (no leading or trailing slash; empty for the bucket's top)."""

    scheme: str
    path: str  # file: the absolute folder; s3: the key prefix
    bucket: str = ""

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def uri(self) -> str:
        """What Spark, delta-rs and the user read: the absolute path of a local root, ``s3://b/p`` otherwise."""
        if self.is_local:
            return self.path
        return f"s3://{self.bucket}/{self.path}" if self.path else f"s3://{self.bucket}"

    def join(self, *parts: str) -> str:
        """The URI (or local path) of ``parts`` under this root."""
        tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
        if not tail:
            return self.uri
        return f"{self.uri.rstrip('/')}/{tail}"

    def key(self, *parts: str) -> str:
        """An object key (s3) or a path relative to the root's folder (file) for ``parts``."""
        tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
        if self.is_local:
            return tail
        return f"{self.path}/{tail}" if self.path and tail else (self.path or tail)

    def sub(self, *parts: str) -> Root:
        """The root of the folder ``parts`` under this one (the lake's ``_data_docs``)."""
        if self.is_local:
            return Root(self.scheme, str(self.local(*parts)))
        return Root(self.scheme, self.key(*parts), self.bucket)

    def local_path(self) -> Path | None:
        """The root's folder when it is one on this machine; None on object storage."""
        return Path(self.path) if self.is_local else None

    def url(self, *parts: str) -> str:
        """What a browser opens for ``parts``: a ``file://`` URL on a local root, the object's URI otherwise."""
        location = self.join(*parts)
        return f"file://{location}" if self.is_local else location

    def local(self, *parts: str) -> Path:
        """The local path of ``parts``; a clear error on object storage, where there is none."""
        if not self.is_local:
            raise ValueError(f"{self.uri} is on object storage: there is no local path for {'/'.join(parts)}")
        return Path(self.path).joinpath(*parts)

    def __str__(self) -> str:
        return self.uri


def parse_root(value: str | os.PathLike[str], key: str, *, base: Path | None = None) -> Root:
    """``value`` (a local path, ``file://`` URI or ``s3://bucket/prefix``) as a :class:`Root`; relative local
    paths are taken from ``base`` (default: the working folder). Anything else fails naming ``key``."""
    text = os.fspath(value).strip()
    if not text:
        raise ConfigError(f"{key}: empty; give a folder path, file:///path or s3://bucket/prefix")
    parsed = urlparse(text)
    scheme = SCHEME_ALIASES.get(parsed.scheme.lower(), parsed.scheme.lower())
    if len(scheme) <= 1:  # no scheme, or a Windows drive letter: a local path
        folder = Path(text).expanduser()
        return Root("file", str((base or Path.cwd()) / folder if not folder.is_absolute() else folder))
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"{key}: {text!r} names host {parsed.netloc!r}; a file:// URI is local: file:///path")
        return Root("file", str(Path(unquote(parsed.path))))
    if scheme in OBJECT_SCHEMES:
        if not parsed.netloc:
            raise ConfigError(f"{key}: {text!r} has no bucket; use s3://bucket/prefix")
        prefix = str(PurePosixPath("/" + unquote(parsed.path))).strip("/")
        return Root(scheme, prefix, parsed.netloc)
    raise ConfigError(f"{key}: {text!r}: the scheme {parsed.scheme}:// is not supported; use a local path, "
                      "file:///path or s3://bucket/prefix")


def on_object_storage(*roots: Root) -> bool:
    """Whether any of ``roots`` is on object storage (then Spark needs the S3A file system and credentials)."""
    return any(not root.is_local for root in roots)


def child(uri: str | os.PathLike[str], *parts: str) -> str:
    """``parts`` under a table's URI or local path (``s3://b/lake/gold/t`` + ``part-0.parquet``)."""
    text = os.fspath(uri)
    tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return f"{text.rstrip('/')}/{tail}" if tail else text


def name_of(uri: str | os.PathLike[str]) -> str:
    """The last segment of a URI or local path: a table's name (``gold/t`` -> ``t``)."""
    return PurePosixPath(os.fspath(uri).rstrip("/")).name


@dataclass(frozen=True)
class Credentials:
    """Endpoint, region and keys for object storage, from the standard AWS variables."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials:
        env = os.environ if env is None else env
        return cls(
            endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )

    @property
    def plain_http(self) -> bool:
        """An ``http://`` endpoint: a test server on loopback, or a gateway inside a private network."""
        return bool(self.endpoint_url and self.endpoint_url.lower().startswith("http://"))

    def delta_options(self) -> dict[str, str]:
        """Storage options for delta-rs (``object_store``'s keys). A custom endpoint is addressed path-style:
        S3-compatible servers (MinIO, s3proxy, Ceph) serve ``endpoint/bucket/key``."""
        options: dict[str, str] = {}
        if self.endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        if self.plain_http:
            options["AWS_ALLOW_HTTP"] = "true"
        for name, value in (("AWS_REGION", self.region), ("AWS_ACCESS_KEY_ID", self.access_key_id),
                            ("AWS_SECRET_ACCESS_KEY", self.secret_access_key),
                            ("AWS_SESSION_TOKEN", self.session_token)):
            if value:
                options[name] = value
        return options

    def spark_conf(self) -> dict[str, str]:
        """Hadoop S3A settings (``spark.hadoop.fs.s3a.*``) that make ``s3://`` URIs the same objects in Spark."""
        prefix = "spark.hadoop.fs.s3a."
        conf = {
            # s3:// is what the user wrote and what delta-rs reads; S3A serves it in Spark.
            "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            # And through FileContext, which Structured Streaming manages its checkpoints with: without it,
            # Spark falls back to the FileSystem API with a warning per state store folder.
            "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
            prefix + "path.style.access": "true" if self.endpoint_url else "false",
        }
        if self.endpoint_url:
            conf[prefix + "endpoint"] = self.endpoint_url
            conf[prefix + "connection.ssl.enabled"] = "false" if self.plain_http else "true"
        if self.region:
            conf[prefix + "endpoint.region"] = self.region
        if self.access_key_id and self.secret_access_key:
            conf[prefix + "access.key"] = self.access_key_id
            conf[prefix + "secret.key"] = self.secret_access_key
            if self.session_token:
                conf[prefix + "session.token"] = self.session_token
                conf[prefix + "aws.credentials.provider"] = (
                    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")
            else:
                conf[prefix + "aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        return conf

    def boto3_client(self) -> Any:
        """A boto3 S3 client for the driver's own objects (state, leases, landing listings)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region, aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key, aws_session_token=self.session_token,
            config=Config(s3={"addressing_style": "path" if self.endpoint_url else "auto"},
                          retries={"max_attempts": 5, "mode": "standard"}))


# The object-storage roots this process reaches, with the credentials that reach them (load_settings mounts the
# lake and the landing zone). Code that holds only a table's URI (the snapshot readers, the ops tables' writer)
# looks its credentials up here, as Hadoop looks up per-bucket settings: a URI under no mounted root falls back
# to the standard AWS variables.
_MOUNTED: dict[str, Credentials] = {}


def mount(root: Root, credentials: Credentials) -> None:
    """Reach the objects under ``root`` with ``credentials`` from now on (nothing to do for a local root)."""
    if not root.is_local:
        _MOUNTED[root.uri.rstrip("/") + "/"] = credentials


def credentials_for(uri: str | os.PathLike[str]) -> Credentials | None:
    """The credentials of an object-storage URI (those of the longest mounted root it lies under, else the
    standard AWS variables); None for a local path, which needs none."""
    text = os.fspath(uri)
    scheme = urlparse(text).scheme.lower()
    if SCHEME_ALIASES.get(scheme, scheme) not in OBJECT_SCHEMES:
        return None
    text = "s3" + text[len(scheme):]
    under = [root for root in _MOUNTED if (text.rstrip("/") + "/").startswith(root)]
    return _MOUNTED[max(under, key=len)] if under else Credentials.from_env()


def storage_options(uri: str | os.PathLike[str]) -> dict[str, str] | None:
    """delta-rs's storage options for a table's URI: None for a local path."""
    credentials = credentials_for(uri)
    return None if credentials is None else credentials.delta_options()


@dataclass(frozen=True)
class Lake:
    """The lake's root and the credentials to reach it: every table and checkpoint URI comes from here."""

    root: Root
    credentials: Credentials = field(default_factory=Credentials)

    @property
    def uri(self) -> str:
        return self.root.uri

    @property
    def is_local(self) -> bool:
        return self.root.is_local

    def table(self, name: str) -> str:
        """The URI (or local path) of the table ``name`` (``bronze/readings``)."""
        return self.root.join(name)

    def local(self, *parts: str) -> Path:
        """The local path of ``parts`` under a local lake (what is not on object storage yet); a clear error
        on object storage."""
        return self.root.local(*parts)

    def local_path(self) -> Path | None:
        """The lake's folder when it is one on this machine (to check before use); None on object storage."""
        return self.root.local_path()

    def __str__(self) -> str:
        return self.root.uri

    def checkpoint(self, *parts: str) -> str:
        return self.root.join("_checkpoints", *parts)

    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options: none for a local lake."""
        return {} if self.root.is_local else self.credentials.delta_options()

    def spark_conf(self) -> dict[str, str]:
        """Spark settings the lake needs: none for a local lake."""
        return {} if self.root.is_local else self.credentials.spark_conf()
