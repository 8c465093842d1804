"""Each cloud's adapter behind `guirl.vmpool.cloud.CloudAPI`: `aws` (boto3), `volcengine` (volcengine SDK),
`aliyun` (Alibaba Cloud SDK). The SDK of a cloud is imported only when that cloud is used."""

from __future__ import annotations

from typing import Any

from guirl.config.validate import CLOUDS, check_cloud
from guirl.vmpool.provider import ProviderError

__all__ = ["CLOUDS", "check_cloud", "make_cloud"]


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
