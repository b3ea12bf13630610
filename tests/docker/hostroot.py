"""The Docker tier's image, built locally with `docker import` (no registry is reachable).

Owns: `modeltap-hostroot:local`, an empty root with the usr-merge links (`bin -> usr/bin`, `lib ->
usr/lib`, `lib64 -> usr/lib64`, `sbin -> usr/sbin`), a minimal `etc/passwd` and a `/work` directory.
Run with the host's `/usr` mounted read-only it has node, python3, bash and coreutils, and
with the npm prefix mounted, the agent CLIs. Does not own: running containers (modeltap.adapter.sandbox).

    python -m tests.docker.hostroot        # what `make docker-image` runs; prints the image id
"""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile

import docker

IMAGE = "modeltap-hostroot:local"
LABEL_DIGEST = "modeltap.hostroot.digest"
DIRECTORIES = {"etc": 0o755, "tmp": 0o1777, "work": 0o755, "root": 0o700, "usr": 0o755, "opt": 0o755}
LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/bash\n",
    "etc/group": "root:x:0:\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}
CHANGES = ["ENV PATH=/usr/local/bin:/usr/bin:/bin", "ENV LANG=C.UTF-8", "WORKDIR /work"]


def root_tar() -> bytes:
    """The image's file system as an uncompressed tar, identical bytes on every call."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, mode in DIRECTORIES.items():
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            archive.addfile(info)
        for name, target in LINKS.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
        for name, text in FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def ensure_image(client: docker.DockerClient) -> str:
    """Build the image unless one built from the same root and settings exists; return its id."""
    tar = root_tar()
    digest = hashlib.sha256(tar + "\n".join(CHANGES).encode()).hexdigest()[:16]
    try:
        image = client.images.get(IMAGE)
        if image.labels.get(LABEL_DIGEST) == digest:
            return image.id
    except docker.errors.ImageNotFound:
        pass
    repository, tag = IMAGE.split(":")
    client.api.import_image_from_data(
        tar, repository=repository, tag=tag, changes=[*CHANGES, f"LABEL {LABEL_DIGEST}={digest}"]
    )
    return client.images.get(IMAGE).id


def main() -> int:
    client = docker.from_env()
    try:
        print(IMAGE, ensure_image(client))
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
