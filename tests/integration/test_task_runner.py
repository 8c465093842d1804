"""OSWorld task setup and evaluation on a real local VM, with files served from a loopback HTTP server."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest
from aiohttp import web

from guirl.agent.actions import Done, Fail
from guirl.vmpool.tasks.evaluate import evaluate
from guirl.vmpool.tasks.files import cache_path
from guirl.vmpool.tasks.model import parse_task
from guirl.vmpool.tasks.setup import SetupError, TaskContext, run_setup
from tests.helpers import run
from tests.integration.test_local_vm import local_vm


@contextlib.asynccontextmanager
async def file_server(files: dict[str, bytes]):
    """A real HTTP server on 127.0.0.1 (random port) serving `files`; counts requests per path."""
    hits: dict[str, int] = {}

    async def serve(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        hits[name] = hits.get(name, 0) + 1
        if name not in files:
            raise web.HTTPNotFound()
        return web.Response(body=files[name])

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        await runner.cleanup()


def _ctx(tmp_path: Path, task_id: str) -> TaskContext:
    (tmp_path / "cache" / task_id).mkdir(parents=True, exist_ok=True)
    return TaskContext(
        task_id=task_id,
        cache_dir=tmp_path / "cache" / task_id,
        download_cache=tmp_path / "downloads",
        width=800,
        height=600,
    )


def task(**kw) -> object:
    base = {"id": "t", "instruction": "x", "config": [], "evaluator": {"func": "infeasible"}}
    base.update(kw)
    return parse_task(json.dumps(base))


def test_setup_download_and_evaluate(tmp_path):
    async def main():
        async with (
            file_server({"notes.txt": b"alpha\nbeta\n"}) as (url, hits),
            local_vm(tmp_path) as (_p, _v, client),
        ):
            t = task(
                id="notes",
                config=[
                    {
                        "type": "download",
                        "parameters": {
                            "files": [{"url": f"{url}/notes.txt", "path": "/home/user/Desktop/notes.txt"}]
                        },
                    },
                    {
                        "type": "execute",
                        "parameters": {"command": ["bash", "-c", "echo {SCREEN_WIDTH_HALF} > ~/half.txt"]},
                    },
                    {"type": "sleep", "parameters": {"seconds": 0.1}},
                ],
                evaluator={
                    "func": ["compare_text_file", "exact_match", "check_include_exclude"],
                    "result": [
                        {"type": "vm_file", "path": "/home/user/Desktop/notes.txt", "dest": "notes.txt"},
                        {"type": "vm_command_line", "command": ["cat", "/home/user/half.txt"]},
                        {"type": "vm_command_line", "command": "ls /home/user/Desktop", "shell": True},
                    ],
                    "expected": [
                        {"type": "cloud_file", "path": f"{url}/notes.txt", "dest": "notes_gold.txt"},
                        {"type": "rule", "rules": {"expected": "400\n"}},
                        {"type": "rule", "rules": {"include": ["notes.txt"], "exclude": ["secret"]}},
                    ],
                },
            )
            ctx = _ctx(tmp_path, t.id)
            await run_setup(client, t.config, ctx)
            assert hits["notes.txt"] == 1 and cache_path(ctx.download_cache, f"{url}/notes.txt").exists()
            ctx.actions = [Done()]
            assert await evaluate(t, client, ctx) == 1.0
            # the agent damages the file: the conjunction fails
            await client.execute(["bash", "-c", "echo gamma >> ~/Desktop/notes.txt"])
            assert await evaluate(t, client, ctx) == 0.0
            assert hits["notes.txt"] == 1  # the gold file came from the cache, keyed by URL
            # a URL that cannot be reached is a clear setup error, never a silent pass
            broken = task(
                config=[
                    {
                        "type": "download",
                        "parameters": {"files": [{"url": f"{url}/missing.txt", "path": "/home/user/x"}]},
                    }
                ]
            )
            with pytest.raises(SetupError, match="missing.txt.*404"):
                await run_setup(client, broken.config, ctx)
            with pytest.raises(SetupError, match="not implemented"):
                await run_setup(client, task(config=[{"type": "no_such_step", "parameters": {}}]).config, ctx)
            with pytest.raises(SetupError, match="set env.google_drive_settings"):
                await run_setup(client, task(config=[{"type": "googledrive", "parameters": {}}]).config, ctx)

    run(main())


def test_infeasible_scores_one_only_after_fail(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (_p, _v, client):
            infeasible = task(id="inf")
            feasible = task(
                id="feas",
                evaluator={
                    "func": "exact_match",
                    "result": {"type": "rule", "rules": 1},
                    "expected": {"type": "rule", "rules": {"expected": 1}},
                },
            )
            ctx = _ctx(tmp_path, "inf")
            for actions, inf_score, feas_score in (
                ([Fail()], 1.0, 0.0),
                ([Done()], 0.0, 1.0),
                ([], 0.0, 1.0),
            ):
                ctx.actions = actions
                assert await evaluate(infeasible, client, ctx) == inf_score
                assert await evaluate(feasible, client, ctx) == feas_score

    run(main())


def test_open_and_window_steps(tmp_path):
    async def main():
        async with local_vm(tmp_path) as (_p, _v, client):
            await client.upload("/home/user/Desktop/open-me.txt", b"hi\n")
            t = task(
                config=[
                    {"type": "open", "parameters": {"path": "/home/user/Desktop/open-me.txt"}},
                    {"type": "activate_window", "parameters": {"window_name": "open-me.txt"}},
                ]
            )
            ctx = _ctx(tmp_path, "open")
            await run_setup(client, t.config, ctx)  # returns once the file's window exists
            windows = (await client.execute(["wmctrl", "-l"]))["output"]
            assert "open-me.txt" in windows
            close = task(config=[{"type": "close_window", "parameters": {"window_name": "open-me.txt"}}])
            await run_setup(client, close.config, ctx)
            left = await client.execute(
                [
                    "bash",
                    "-c",
                    "for i in $(seq 50); do wmctrl -l | grep -q open-me || exit 0; sleep 0.1; done; exit 1",
                ]
            )
            assert left["returncode"] == 0, "the window was not closed"
            with pytest.raises(SetupError, match="404"):
                await run_setup(
                    client, task(config=[{"type": "open", "parameters": {"path": "/nope.txt"}}]).config, ctx
                )

    run(main())


def test_an_evaluator_that_raises_scores_zero_and_only_a_silent_vm_is_an_environment_fault(tmp_path):
    """As OSWorld's runner records it: a metric that raises on what the episode left scores 0, the reason
    kept; a postconfig step the VM refuses is noted and scoring goes on. A VM that does not answer at all
    is an environment fault (`EvaluationError`: played again, never scored)."""
    from guirl.vmpool.client import VMClient
    from guirl.vmpool.tasks.evaluate import EvaluationError

    crashes = task(
        id="crash",
        evaluator={
            "func": "exact_match",
            "result": {"type": "rule", "rules": 1},
            "expected": {"type": "rule"},
        },
    )
    refused_post = task(
        id="post",
        evaluator={
            "postconfig": [{"type": "open", "parameters": {"path": "/home/user/no-such-file.txt"}}],
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "echo hi", "shell": True},
            "expected": {"type": "rule", "rules": {"expected": "hi\n"}},
        },
    )
    silent = task(
        id="silent",
        evaluator={
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "echo hi", "shell": True},
            "expected": {"type": "rule", "rules": {"expected": "hi\n"}},
        },
    )

    async def main():
        ctx = _ctx(tmp_path, "crash")
        async with VMClient(f"unix://{tmp_path}/no-vm.sock", retries=1) as gone:
            assert await evaluate(crashes, gone, ctx) == 0.0  # exact_match(1, None): TypeError
            assert len(ctx.evaluation_errors) == 1 and "TypeError" in ctx.evaluation_errors[0]
            with pytest.raises(EvaluationError, match="did not answer"):
                await evaluate(silent, gone, _ctx(tmp_path, "silent"))
            with pytest.raises(EvaluationError, match="postconfig.*Cannot connect"):
                await evaluate(refused_post, gone, _ctx(tmp_path, "post-gone"))
        async with local_vm(tmp_path) as (_p, _v, client):
            ctx = _ctx(tmp_path, "post")
            assert await evaluate(refused_post, client, ctx) == 1.0
            assert len(ctx.evaluation_errors) == 1 and "postconfig" in ctx.evaluation_errors[0]
            # how the score was reached, as result.json keeps it for `guirl view`
            assert ctx.evaluation["score"] == 1.0 and ctx.evaluation["conj"] == "and"
            [m] = ctx.evaluation["metrics"]
            assert (m["metric"], m["result_getter"], m["result"], m["expected_getter"], m["score"]) == (
                "exact_match",
                "vm_command_line",
                "hi\n",
                "rule",
                1.0,
            )

    run(main(), timeout=120)


def test_a_gold_side_failure_is_never_the_policys_zero(tmp_path):
    """An expected file that cannot be downloaded, or one the metric cannot score even against itself, is
    the task's (or the evaluating host's) fault: `EvaluationError`, never a score of 0 to train on. A
    result that cannot be scored against a good gold file is the policy's 0."""
    import io

    import docx

    from guirl.vmpool.client import VMClient
    from guirl.vmpool.tasks.evaluate import EvaluationError

    page = io.BytesIO()
    document = docx.Document()
    document.add_paragraph("hello")
    document.save(page)
    files = {"answer.docx": page.getvalue(), "gold.docx": page.getvalue(), "broken.docx": b"not a document"}

    def scored(url: str, result: str, gold: str) -> object:
        return task(
            id=f"{result}-{gold}",
            evaluator={
                "func": "compare_docx_files",
                "result": {"type": "cloud_file", "path": f"{url}/{result}", "dest": "result.docx"},
                "expected": {"type": "cloud_file", "path": f"{url}/{gold}", "dest": "gold.docx"},
            },
        )

    async def main():
        async with (
            file_server(files) as (url, _hits),
            VMClient(f"unix://{tmp_path}/no-vm.sock", retries=1) as unused,  # cloud files need no VM
        ):
            ctx = _ctx(tmp_path, "a")
            assert await evaluate(scored(url, "answer.docx", "gold.docx"), unused, ctx) == 1.0
            # a file the getters brought here is kept as its name and size, never its bytes
            [m] = ctx.evaluation["metrics"]
            assert re.fullmatch(r"file \S+\.docx \(\d+ bytes\)", m["result"]) and m["expected"].startswith(
                "file "
            )
            with pytest.raises(EvaluationError, match="expected value could not be obtained"):
                await evaluate(scored(url, "answer.docx", "missing.docx"), unused, _ctx(tmp_path, "b"))
            with pytest.raises(EvaluationError, match="cannot score the gold file against itself"):
                await evaluate(scored(url, "answer.docx", "broken.docx"), unused, _ctx(tmp_path, "c"))
            ctx = _ctx(tmp_path, "d")
            assert await evaluate(scored(url, "broken.docx", "gold.docx"), unused, ctx) == 0.0
        # an `expected` read from the VM (an original on the Desktop the policy may have overwritten) is not
        # gold: the metric failing on it is the policy's 0
        async with local_vm(tmp_path) as (_p, _v, client):
            await client.upload("/home/user/answer.docx", files["answer.docx"])
            await client.upload("/home/user/original.docx", files["broken.docx"])
            on_vm = task(
                id="on-vm",
                evaluator={
                    "func": "compare_docx_files",
                    "result": {"type": "vm_file", "path": "/home/user/answer.docx", "dest": "a.docx"},
                    "expected": {"type": "vm_file", "path": "/home/user/original.docx", "dest": "o.docx"},
                },
            )
            ctx = _ctx(tmp_path, "e")
            assert await evaluate(on_vm, client, ctx) == 0.0 and len(ctx.evaluation_errors) == 1

    run(main(), timeout=60)
