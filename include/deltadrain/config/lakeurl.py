"""Places on the object store (`s3a://bucket/prefix`), standing in for the lake's Path. Pure."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit


def is_s3_url(path: str | Path) -> bool:
    return str(path).startswith(("s3a://", "s3://"))


def bucket_and_key(url: str) -> tuple[str, str]:
    """`s3a://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    parts = urlsplit(url)
    if parts.scheme not in ("s3a", "s3") or not parts.netloc:
        raise ValueError(f"{url!r} is not an s3a://bucket/key URL")
    return parts.netloc, parts.path.lstrip("/")


class LakeUrl:
    """A place on the object store (`s3a://bucket/some/prefix`) where a local lake has a Path: it joins
    with `/` and prints as its URL, so every table path built from the lake's is one too. A Path would
    fold the URL's `//` into `/`."""

    __slots__ = ("url",)

    def __init__(self, url: str):
        bucket, key = bucket_and_key(url)
        parts = [p for p in key.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"{url!r}: '.' and '..' name no place on an object store")
        self.url = f"s3a://{bucket}" + "".join(f"/{p}" for p in parts)

    def __truediv__(self, other) -> LakeUrl:
        return LakeUrl(f"{self.url}/{other}")

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"LakeUrl({self.url!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, LakeUrl) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[1] if self.key else ""

    @property
    def bucket(self) -> str:
        return bucket_and_key(self.url)[0]

    @property
    def key(self) -> str:
        return bucket_and_key(self.url)[1]

    @property
    def parents(self) -> tuple[LakeUrl, ...]:
        parts = self.key.split("/") if self.key else []
        return tuple(LakeUrl(f"s3a://{self.bucket}/{'/'.join(parts[:n])}") for n in range(len(parts) - 1, -1, -1))

    def fs_path(self) -> str:
        """`bucket/key`, as pyarrow's S3FileSystem names it."""
        return f"{self.bucket}/{self.key}".rstrip("/")

    def is_absolute(self) -> bool:
        return True

    def resolve(self) -> LakeUrl:
        return self

    def expanduser(self) -> LakeUrl:
        return self

    def as_uri(self) -> str:
        return self.url
