"""s3proxy, a real S3 server on 127.0.0.1 (``jars.lock``'s s3proxy set, fetched by ``make setup``): its
filesystem backend keeps each bucket as a folder, it checks SigV4 signatures against one identity, and its 4.x
line implements conditional puts (``If-None-Match: *``), which delta-rs's commits and sluice's leases rely on.
The platform's lake and landing zone live on it, and so do the object-storage tests'."""

from __future__ import annotations

from pathlib import Path

from sluice.core.jars import jar_paths


def s3proxy_command(root: Path, port: int, access_key: str, secret_key: str, region: str) -> list[str]:
    """The command that serves ``<root>/data`` on ``http://127.0.0.1:<port>`` (its settings are written to
    ``<root>/s3proxy.properties``)."""
    (jar,) = jar_paths(("s3proxy",))
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    properties = root / "s3proxy.properties"
    properties.write_text("\n".join([
        f"s3proxy.endpoint=http://127.0.0.1:{port}",
        "s3proxy.authorization=aws-v2-or-v4",
        f"s3proxy.identity={access_key}",
        f"s3proxy.credential={secret_key}",
        "jclouds.provider=filesystem",
        f"jclouds.filesystem.basedir={data}",
        f"jclouds.regions={region}",
    ]) + "\n")
    return ["java", "-jar", str(jar), "--properties", str(properties)]
