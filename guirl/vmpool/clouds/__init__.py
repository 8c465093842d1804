"""Each cloud's adapter behind `guirl.vmpool.cloud.CloudAPI`: `aws` (boto3), `volcengine` (volcengine SDK),
`aliyun` (Alibaba Cloud SDK). The SDK of a cloud is imported only when that cloud is used."""

from __future__ import annotations

from typing import Any

from guirl.vmpool.provider import ProviderError

CLOUDS = ("aws", "volcengine", "aliyun")


def make_cloud(provider: str, cloud: Any, region: str) -> Any:
    """The adapter of `provider` (a `CloudConfig` gives its settings; `region` is `env.region`)."""
    try:
        match provider:
            case "aws":
                from guirl.vmpool.clouds.aws import AWSCloud

                return AWSCloud(cloud.aws, region, replace_timeout_s=cloud.ready_timeout_s)
            case "volcengine":
                from guirl.vmpool.clouds.volcengine import VolcengineCloud

                return VolcengineCloud(cloud.volcengine, region, wait_s=cloud.ready_timeout_s)
            case "aliyun":
                from guirl.vmpool.clouds.aliyun import AliyunCloud

                return AliyunCloud(cloud.aliyun, region, wait_timeout_s=cloud.ready_timeout_s)
    except ImportError as exc:
        raise ProviderError(
            f"env.provider = {provider!r} needs its SDK: pip install -e '.[{provider}]' ({exc})"
        ) from None
    raise ProviderError(f"env.provider = {provider!r}: not a cloud (one of {', '.join(CLOUDS)})")


REQUIRED = {
    "aws": ("image_id", "subnet_id", "security_group_id"),
    "volcengine": ("access_key", "secret_key", "image_id", "subnet_id", "security_group_id"),
    "aliyun": ("access_key_id", "access_key_secret", "image_id", "vswitch_id", "security_group_id"),
}


def check_cloud(provider: str, cloud: Any) -> None:
    """The settings a cloud provider needs, checked before anything starts: ValueError naming what is
    missing or unsafe (a `cluster_cidr` that would open the VM server to the internet)."""
    from guirl.vmpool.cloud import check_cidr

    if provider == "local":
        return
    if provider not in CLOUDS:
        raise ValueError(f"env.provider = {provider!r}: not a cloud (one of {', '.join(CLOUDS)})")
    check_cidr(cloud.cluster_cidr)
    section = getattr(cloud, provider)
    missing = [f"cloud.{provider}.{k}" for k in REQUIRED[provider] if not getattr(section, k)]
    if missing:
        raise ValueError(f"env.provider = {provider!r} needs {', '.join(missing)}")
