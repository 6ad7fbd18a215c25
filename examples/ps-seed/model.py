"""Between-graph parameter-server training, TF1 style (``tf.compat.v1``, eager disabled).

The classic distributed-TensorFlow program: every learner runs it with its own ``--job_name``
and ``--task_index`` (``launcher.py`` works them out from the platform's environment).

* ``ps`` tasks start a ``tf.distribute.Server`` and ``join()`` it: they never return; the
  platform stops them when the workers are done.
* ``worker`` tasks build the same graph with ``replica_device_setter`` (variables on the ps
  tasks, round robin, compute on the worker) and train in a ``MonitoredTrainingSession`` until
  the shared global step reaches ``--steps``.  Worker 0 is the chief: it initialises the
  variables, writes checkpoints to ``--checkpoint_dir`` and, once every worker has reported
  done (a shared FIFO queue), exports a SavedModel to ``$RESULT_DIR/model``.
* With no ps tasks (``--ps_hosts ''``) the variables live on worker 0 instead.

Model: a 2-16-1 tanh network fitting y = 3*x1 - 2*x2 + 0.5 on data generated per worker.
Prints ``worker=<i> step=<global step> loss=<v>`` lines (flushed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
HIDDEN = 16
Params = dict[str, np.ndarray]


def log(message: str) -> None:
    print(message, flush=True)


def hosts(value: str) -> list[str]:
    return [h for h in value.split(",") if h]


def make_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(samples, 2)).astype(np.float32)
    noise = rng.normal(0.0, 0.05, size=(samples, 1)).astype(np.float32)
    return x, (3.0 * x[:, :1] - 2.0 * x[:, 1:] + 0.5 + noise).astype(np.float32)


def forward(x: tf.Tensor, params: dict[str, tf.Tensor]) -> tf.Tensor:
    hidden = tf.tanh(tf.matmul(x, params["w1"]) + params["b1"])
    return tf.matmul(hidden, params["w2"]) + params["b2"]


def create_params(seed: int = 0) -> dict[str, tf.Variable]:
    init = v1.glorot_uniform_initializer(seed=seed)
    return {
        "w1": v1.get_variable("w1", [2, HIDDEN], initializer=init),
        "b1": v1.get_variable("b1", [HIDDEN], initializer=v1.zeros_initializer()),
        "w2": v1.get_variable("w2", [HIDDEN, 1], initializer=init),
        "b2": v1.get_variable("b2", [1], initializer=v1.zeros_initializer()),
    }


def export_saved_model(values: dict[str, np.ndarray], export_dir: Path) -> None:
    """Write a SavedModel (signature ``serving_default``: x [None, 2] -> y [None, 1]).

    The training graph pins variables to ``/job:ps`` devices and needs the cluster, so it cannot
    be saved as is; instead the trained values go into a fresh, device-free graph and a local
    session, and that graph is exported with the TF1 ``SavedModelBuilder``.  TensorFlow 2's
    ``tf.saved_model.load`` reads it like any other SavedModel.
    """
    with tf.Graph().as_default() as graph, v1.Session(graph=graph) as sess:
        params = {
            name: v1.get_variable(name, initializer=tf.constant(value))
            for name, value in values.items()
        }
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        y = tf.identity(forward(x, params), name="y")
        sess.run(v1.global_variables_initializer())
        signature = v1.saved_model.signature_def_utils.predict_signature_def(
            inputs={"x": x}, outputs={"y": y}
        )
        builder = v1.saved_model.Builder(str(export_dir))
        builder.add_meta_graph_and_variables(
            sess,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map={"serving_default": signature},
            strip_default_attrs=True,
        )
        builder.save()


def run_ps(cluster: tf.train.ClusterSpec, index: int) -> int:
    server = tf.distribute.Server(cluster, job_name="ps", task_index=index)
    log(f"ps={index} serving={cluster.task_address('ps', index)} target={server.target}")
    server.join()  # never returns: the platform stops parameter servers
    return 0


def run_worker(cluster: tf.train.ClusterSpec, index: int, args: argparse.Namespace) -> int:
    num_workers = cluster.num_tasks("worker")
    has_ps = "ps" in cluster.jobs
    is_chief = index == 0
    var_device = "/job:ps" if has_ps else "/job:worker/task:0"
    filters = ["/job:ps"] if has_ps else ["/job:worker/task:0"]
    if f"/job:worker/task:{index}" not in filters:
        filters.append(f"/job:worker/task:{index}")
    # Without device filters a worker waits for *every* task, and non-chief workers hang.
    config = v1.ConfigProto(device_filters=filters, allow_soft_placement=True)
    server = tf.distribute.Server(cluster, job_name="worker", task_index=index, config=config)
    log(
        f"worker={index} workers={num_workers} ps={cluster.num_tasks('ps') if has_ps else 0}"
        f" chief={is_chief} serving={cluster.task_address('worker', index)}"
    )

    x_data, y_data = make_data(args.samples, seed=100 + index)
    worker_device = f"/job:worker/task:{index}"
    # Variables round robin over the ps tasks (or all on worker 0), everything else local.
    setter = v1.train.replica_device_setter(
        ps_tasks=cluster.num_tasks("ps") if has_ps else 1,
        ps_device="/job:ps" if has_ps else "/job:worker",
        worker_device=worker_device,
    )
    with v1.device(setter):
        global_step = v1.train.get_or_create_global_step()
        params = create_params()
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        y = v1.placeholder(tf.float32, [None, 1], name="y")
        loss = tf.reduce_mean(tf.square(forward(x, params) - y))
        optimizer = v1.train.AdamOptimizer(args.learning_rate)
        train_op = optimizer.minimize(loss, global_step=global_step)
        with tf.control_dependencies([train_op]):
            step_after = global_step.read_value()  # the global step this update produced
    # Every worker puts a token into this queue when it is done; the chief takes
    # num_workers - 1 of them before exporting, so the model holds every worker's updates
    # (and, with no ps, the variables on worker 0 outlive the other workers).
    with v1.device(f"{var_device}/task:0" if has_ps else var_device):
        done_queue = v1.FIFOQueue(num_workers, tf.int32, shapes=[], shared_name="workers_done")
        mark_done = done_queue.enqueue(index)
        wait_others = done_queue.dequeue_many(max(num_workers - 1, 1))

    if not is_chief:
        # SessionManager polls readiness every 30 s: wait for the chief's init ourselves.
        not_ready = v1.report_uninitialized_variables()
        deadline = time.monotonic() + args.max_wait
        with v1.Session(server.target, config=config) as probe:
            while probe.run(not_ready).size and time.monotonic() < deadline:
                time.sleep(0.2)

    hooks = [v1.train.StopAtStepHook(last_step=args.steps)]
    rng = np.random.default_rng(index)
    step = local_steps = 0
    last_loss = float("nan")
    started = time.monotonic()
    with v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        checkpoint_dir=args.checkpoint_dir or None,
        hooks=hooks,
        config=config,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
        stop_grace_period_secs=5,
        max_wait_secs=args.max_wait,
    ) as sess:
        while not sess.should_stop():
            batch = rng.integers(0, len(x_data), size=args.batch_size)
            step, last_loss = sess.run(
                [step_after, loss], feed_dict={x: x_data[batch], y: y_data[batch]}
            )
            local_steps += 1
            if local_steps % args.log_every == 0:
                log(f"worker={index} step={step} loss={last_loss:.6f}")

        def finish(step_context: v1.train.MonitoredSession.StepContext) -> Params | None:
            raw = step_context.session
            if not is_chief:
                raw.run(mark_done)
                return None
            if num_workers > 1:
                try:
                    timeout = v1.RunOptions(timeout_in_ms=int(args.max_wait * 1000))
                    raw.run(wait_others, options=timeout)
                except tf.errors.DeadlineExceededError:
                    log(f"worker={index} warning=not every worker reported done")
            return raw.run(params)

        values = sess.run_step_fn(finish)
    if local_steps:
        log(f"worker={index} step={step} loss={last_loss:.6f}")
    log(
        f"worker={index} done global_step={step} local_steps={local_steps}"
        f" seconds={time.monotonic() - started:.2f}"
    )

    if is_chief and values is not None:
        export_dir = Path(os.environ.get("RESULT_DIR") or "results") / "model"
        if export_dir.exists():  # left by an earlier attempt of this training
            shutil.rmtree(export_dir)
        export_dir.parent.mkdir(parents=True, exist_ok=True)
        export_saved_model(values, export_dir)
        test_x, test_y = make_data(512, seed=7)
        with tf.Graph().as_default(), v1.Session() as local:
            placeholder = v1.placeholder(tf.float32, [None, 2])
            consts = {k: tf.constant(v) for k, v in values.items()}
            mse = tf.reduce_mean(tf.square(forward(placeholder, consts) - test_y))
            test_mse = float(local.run(mse, feed_dict={placeholder: test_x}))
        log(f"worker={index} eval_mse={test_mse:.6f}")
        log(f"saved={export_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps_hosts", default="", help="comma-separated host:port of ps tasks")
    parser.add_argument("--worker_hosts", required=True, help="comma-separated host:port")
    parser.add_argument("--job_name", choices=["ps", "worker"], required=True)
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--steps", type=int, default=200, help="global steps to train")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2048, help="examples per worker")
    parser.add_argument("--learning_rate", type=float, default=0.02)
    parser.add_argument("--log_every", type=int, default=20, help="in local steps")
    parser.add_argument("--max_wait", type=float, default=300.0, help="seconds to wait for peers")
    parser.add_argument(
        "--checkpoint_dir",
        default=os.environ.get("CHECKPOINT_DIR", ""),
        help="chief's checkpoints (default $CHECKPOINT_DIR; empty: none)",
    )
    args = parser.parse_args(argv)

    jobs = {"worker": hosts(args.worker_hosts)}
    if hosts(args.ps_hosts):
        jobs["ps"] = hosts(args.ps_hosts)
    cluster = tf.train.ClusterSpec(jobs)
    if args.job_name == "ps":
        return run_ps(cluster, args.task_index)
    v1.disable_eager_execution()
    tf.get_logger().setLevel("ERROR")  # TF1 API deprecation warnings
    return run_worker(cluster, args.task_index, args)


if __name__ == "__main__":
    sys.exit(main())
