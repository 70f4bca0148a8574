"""Init container of the Ray pods: merge tenancy.yaml (ConfigMap) with keys.yaml (Secret).

The ConfigMap holds tenants and SLA classes without key material; the Secret holds ``key_salt``
(the secret that keys every API-key HMAC), ``admin_key_hash``, optionally ``metrics_key_hash``
(a scraper's key, /metrics only) and ``api_key_hashes: {tenant_id: [hash, ...]}``. The merged file is what
``cluster.config.AppConfig.tenancy_config`` points at. When the ``tenancy`` package is importable
(it is in the fairlane image) the result is validated here, so a bad config stops the pod at start.
"""

from __future__ import annotations

import argparse
import os
import sys

import yaml


def merge(config: dict, keys: dict) -> dict:
    """The tenancy config with tenants' ``api_key_hashes``, ``admin_key_hash``, ``key_salt`` filled in."""
    hashes = keys.get("api_key_hashes") or {}
    tenants = []
    for tenant in config.get("tenants") or []:
        tenant_id = tenant.get("id")
        if tenant_id not in hashes:
            raise ValueError(f"tenant {tenant_id!r} has no api_key_hashes in the keys Secret")
        tenants.append({**tenant, "api_key_hashes": list(hashes[tenant_id])})
    unknown = sorted(set(hashes) - {t["id"] for t in tenants})
    if unknown:
        raise ValueError(f"keys Secret names unknown tenants: {', '.join(unknown)}")
    if not keys.get("admin_key_hash"):
        raise ValueError("keys Secret has no admin_key_hash")
    if not keys.get("key_salt"):  # the hashes are HMACs under this salt: without it no key matches
        raise ValueError("keys Secret has no key_salt")
    merged = {**config, "tenants": tenants, "admin_key_hash": keys["admin_key_hash"]}
    if keys.get("metrics_key_hash"):
        merged["metrics_key_hash"] = keys["metrics_key_hash"]
    return merged | {"key_salt": keys["key_salt"]}


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    return data


def _validate(merged: dict) -> None:
    try:
        from tenancy.loader import parse_tenancy_config
    except ImportError:
        return
    parse_tenancy_config(merged, "merged tenancy config")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--keys", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        merged = merge(_read(args.config), _read(args.keys))
        _validate(merged)
    except Exception as exc:  # any problem stops the pod with one clear line
        print(f"tenancy-config: {exc}", file=sys.stderr)
        return 1
    if os.path.exists(args.out):  # a re-run init container: the old file is read-only
        os.unlink(args.out)
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o440)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        yaml.safe_dump(merged, f, sort_keys=False)
    print(f"tenancy-config: wrote {args.out} ({len(merged['tenants'])} tenants)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
