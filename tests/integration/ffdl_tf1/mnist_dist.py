"""Between-graph distributed MNIST, written for TensorFlow 1.x as FfDL-era scripts were
(tf.contrib.layers, input_data, tf.train.Supervisor): every learner runs it with its
--job_name and --task_index (FfDL's launcher.py works them out). TensorFlow 2 has neither
tf.contrib nor tensorflow.examples.tutorials: this form fails at its imports there, and
examples/ffdl-tf-distributed/mnist_dist.py is it ported with the fewest changes."""

import argparse
import os

import tensorflow as tf
from tensorflow.examples.tutorials.mnist import input_data


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ps_hosts", default="")
    parser.add_argument("--worker_hosts", default="")
    parser.add_argument("--job_name", default="worker")
    parser.add_argument("--task_index", type=int, default=0)
    parser.add_argument("--data_dir", default=os.environ.get("DATA_DIR", "."))
    parser.add_argument("--model_dir", default=os.environ.get("RESULT_DIR", "."))
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    cluster = tf.train.ClusterSpec(
        {"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")}
    )
    server = tf.train.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        print(f"ps {args.task_index} serving", flush=True)
        server.join()
        return

    mnist = input_data.read_data_sets(args.data_dir, one_hot=True)
    is_chief = args.task_index == 0
    worker_device = f"/job:worker/task:{args.task_index}"
    with tf.device(tf.train.replica_device_setter(worker_device=worker_device, cluster=cluster)):
        x = tf.placeholder(tf.float32, [None, 784])
        labels = tf.placeholder(tf.float32, [None, 10])
        hidden = tf.contrib.layers.fully_connected(
            x, 64, weights_initializer=tf.contrib.layers.xavier_initializer()
        )
        logits = tf.contrib.layers.fully_connected(hidden, 10, activation_fn=None)
        loss = tf.reduce_mean(
            tf.nn.softmax_cross_entropy_with_logits_v2(labels=labels, logits=logits)
        )
        global_step = tf.train.get_or_create_global_step()
        train_op = tf.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
        correct = tf.equal(tf.argmax(logits, 1), tf.argmax(labels, 1))
        accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
        saver = tf.train.Saver()
        init_op = tf.global_variables_initializer()

    supervisor = tf.train.Supervisor(
        is_chief=is_chief, init_op=init_op, global_step=global_step, logdir=None
    )
    with supervisor.managed_session(server.target) as sess:
        step = 0
        while not supervisor.should_stop() and step < args.steps:
            images, batch_labels = mnist.train.next_batch(32)
            _, step, value = sess.run(
                [train_op, global_step, loss], feed_dict={x: images, labels: batch_labels}
            )
            if step % 10 == 0:
                print(f"worker {args.task_index} step={step} loss={value:.4f}", flush=True)
        test = {x: mnist.test.images, labels: mnist.test.labels}
        print(f"worker {args.task_index} accuracy={sess.run(accuracy, test):.3f}", flush=True)
        if is_chief:
            saver.save(sess, os.path.join(args.model_dir, "model.ckpt"), write_meta_graph=False)
            print(f"model saved to {args.model_dir}", flush=True)
    supervisor.stop()


if __name__ == "__main__":
    main()
