"""guirl's versions of OSWorld's metrics, by OSWorld's names (semantics in docs/osworld-compat.md §5.2).

Each is called as OSWorld calls it: `metric(result_state, expected_state, **options)` when the task has
`expected`, else `metric(result_state, **options)`, and returns a float in [0, 1]. A result the
policy spoiled (missing, unparsable) scores 0.0; a task guirl cannot score raises `UnsupportedMetric`.
"""

from __future__ import annotations

from collections.abc import Callable


class UnsupportedMetric(Exception):
    """The task needs a metric (or a metric option, such as a compare_table rule type) guirl lacks."""


# Imported after UnsupportedMetric is defined: table.py and docs.py raise it for inputs they lack.
# One module per family of OSWorld's Linux suite, each exporting its own `METRICS` by OSWorld's names.
from guirl.vmpool.tasks.metrics import (  # noqa: E402
    browser,
    images,
    impress,
    media,
    settings,
    system,
    writer,
)
from guirl.vmpool.tasks.metrics.docs import compare_docx_files  # noqa: E402
from guirl.vmpool.tasks.metrics.general import (  # noqa: E402
    check_direct_json_object,
    check_include_exclude,
    check_list,
    exact_match,
    file_contains,
    fuzzy_match,
    is_in_list,
    literal_match,
)
from guirl.vmpool.tasks.metrics.slides import compare_pptx_files  # noqa: E402
from guirl.vmpool.tasks.metrics.table import compare_table  # noqa: E402
from guirl.vmpool.tasks.metrics.text import compare_text_file  # noqa: E402

METRICS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match,
    "check_include_exclude": check_include_exclude,
    "check_direct_json_object": check_direct_json_object,
    "check_list": check_list,
    "file_contains": file_contains,
    "fuzzy_match": fuzzy_match,
    "is_in_list": is_in_list,
    "literal_match": literal_match,
    "compare_text_file": compare_text_file,
    "compare_table": compare_table,
    "compare_docx_files": compare_docx_files,
    "compare_pptx_files": compare_pptx_files,
}
for _module in (browser, impress, images, media, settings, system, writer):
    _clash = METRICS.keys() & _module.METRICS.keys()
    assert not _clash, f"metrics defined twice: {sorted(_clash)}"
    METRICS.update(_module.METRICS)


def get_metric(name: str) -> Callable[..., float]:
    """The metric OSWorld calls `name`; raises UnsupportedMetric when guirl has no version of it."""
    try:
        return METRICS[name]
    except KeyError:
        raise UnsupportedMetric(f"metric {name!r} is not implemented") from None


__all__ = ["METRICS", "UnsupportedMetric", "get_metric"]
