"""`guirl view RUN_DIR`: a run as a static site, to see an agent's episodes instead of reading them.

The site is written into `RUN_DIR/view/` and works from `file://`, offline: no CDN, no network, its one
script and stylesheet are guirl's own (`guirl.view.html`). Pages:

- `index.html`, the run page: the summary, accuracy per domain, environment errors, aborted and skipped tasks
  (apart from the policy's failures), training curves per policy version as inline SVG plots, the resolved
  configuration, and whatever could not be read ("Not shown");
- `tasks.html`, the task table: every task with its episodes, outcome, score, steps, attempts; sortable,
  filterable, a thumbnail of each task's deciding episode;
- `t/<task>.html`, a task's episodes; `e/<task>/<episode>.html`, an episode: each step's screenshot with its
  action drawn on it, the model's output, the parsed action or parse error, timing, the judge's verdict and
  the step's advantage when logged, the final screen and how the evaluator scored it (`guirl.view.episode`);
- `compare.html`: two runs (`--compare OTHER_RUN`) or two evaluation rounds of a train run (`--versions A B`;
  by default its first and last) side by side, task by task.

A folder of runs (`guirl learn`'s) gets a site per run and an index of them. Rebuilding is incremental: an
episode page whose files did not change is kept, a thumbnail is made once. `--serve` serves the run
directory on loopback and rebuilds as the run writes; open pages reload themselves (`guirl.view.serve`).
"""

from guirl.view.site import Built, build

__all__ = ["Built", "build"]
