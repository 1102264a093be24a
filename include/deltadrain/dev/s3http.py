"""Signed S3 requests with nothing but the standard library (AWS Signature Version 4, path-style):
the embedded S3 server's health check and the tests that look at the HTTP answers themselves
(a conditional PUT's 200 or 412), which the higher-level clients hide."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from deltadrain.lake.objectstore import S3Settings


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signed_headers(s: S3Settings, method: str, host: str, path: str, query: str, body: bytes,
                   headers: dict[str, str], now: datetime.datetime) -> dict[str, str]:
    """`headers` plus Host, x-amz-date, x-amz-content-sha256 and the Authorization that signs them all."""
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    out = {**{k.lower(): v.strip() for k, v in headers.items()}, "host": host, "x-amz-date": stamp,
           "x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    names = sorted(out)
    canonical = "\n".join([method, path, query, *(f"{n}:{out[n]}" for n in names), "", ";".join(names),
                           out["x-amz-content-sha256"]])
    scope = f"{day}/{s.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = b"AWS4" + s.secret_access_key.encode()
    for part in (day, s.region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["authorization"] = (f"AWS4-HMAC-SHA256 Credential={s.access_key_id}/{scope}, "
                            f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return out


def request(s: S3Settings, method: str, bucket: str = "", key: str = "", body: bytes = b"",
            headers: dict[str, str] | None = None, query: dict[str, str] | None = None,
            timeout: float = 10) -> Response:
    """One signed request to `s.endpoint_url` (an S3-compatible server: path-style addressing)."""
    if s.endpoint_url is None:
        raise ValueError("these requests are for an S3-compatible server's endpoint_url")
    url = urlsplit(s.endpoint_url)
    path = "/" + "/".join(quote(p, safe="-_.~") for p in [bucket, *key.split("/")] if p) if bucket else "/"
    q = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted((query or {}).items()))
    signed = signed_headers(s, method, url.netloc, path, q, body, headers or {},
                            datetime.datetime.now(datetime.UTC))
    conn_type = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    assert url.hostname is not None  # S3Settings refuses an endpoint without one
    conn = conn_type(url.hostname, url.port, timeout=timeout)
    try:
        conn.request(method, path + (f"?{q}" if q else ""), body=body, headers=signed)
        resp = conn.getresponse()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()
