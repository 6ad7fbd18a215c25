"""Stand-ins for the two `tf.contrib.layers` functions FfDL-era scripts use most, which
TensorFlow 2 no longer has (and whose `tf.compat.v1.layers.dense` needs Keras 2), written
with `tf.compat.v1` variables so a between-graph script keeps its graph and its devices."""

import tensorflow.compat.v1 as tf


def xavier_initializer(uniform=True, seed=None):
    """tf.contrib.layers.xavier_initializer: Glorot's initializer."""
    if uniform:
        return tf.glorot_uniform_initializer(seed=seed)
    return tf.glorot_normal_initializer(seed=seed)


def fully_connected(
    inputs, num_outputs, activation_fn=tf.nn.relu, weights_initializer=None, scope=None
):
    """tf.contrib.layers.fully_connected: a dense layer (ReLU unless told otherwise)."""
    with tf.variable_scope(scope, default_name="fully_connected"):
        weights = tf.get_variable(
            "weights",
            [int(inputs.shape[-1]), num_outputs],
            initializer=weights_initializer or xavier_initializer(),
        )
        biases = tf.get_variable("biases", [num_outputs], initializer=tf.zeros_initializer())
        outputs = tf.nn.xw_plus_b(inputs, weights, biases)
        return activation_fn(outputs) if activation_fn is not None else outputs
