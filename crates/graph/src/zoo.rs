//! Built-in models: the networks of the users' questions and small reference models.

use crate::error::GraphError;
use crate::graph::{Graph, GraphBuilder, LossKind};
use crate::op::{Cell, Op, PoolKind, RnnBias};
use crate::shape::{Dim, Shape};

/// Names accepted after `zoo:`.
pub const NAMES: &[&str] = &[
    "seed2-dual",
    "rnn-tutorial",
    "mnist-mlp",
    "mnist-cnn",
    "digits-mlp",
];

/// One line per model, for `--help` and the docs.
pub fn describe(name: &str) -> &'static str {
    match name {
        "seed2-dual" => {
            "a dual-input regressor (a GPU at 5 % utilisation at batch 8192): 26x9x9 image + 8 features, conv, pool, 3 fc, MSE (87,229 parameters)"
        }
        "rnn-tutorial" => {
            "a DeepSpeech-style BiLSTM speech model with CTC (RNN-Tutorial; out of memory above batch 25 on a 6 GB card), T = 100 frames by default"
        }
        "mnist-mlp" => "Keras' mnist_mlp: 784-512-512-10 with dropout, cross-entropy",
        "mnist-cnn" => "Keras' mnist_cnn: two 3x3 convs, max-pool, fc 128, fc 10, cross-entropy",
        "digits-mlp" => "64-128-64-10 MLP for the shipped 8x8 UCI digits, cross-entropy",
        _ => "",
    }
}

/// Builds the zoo model `name`.
pub fn build(name: &str) -> Result<Graph, GraphError> {
    match name {
        "seed2-dual" => seed2_dual(),
        "rnn-tutorial" => rnn_tutorial(),
        "mnist-mlp" => mnist_mlp(),
        "mnist-cnn" => mnist_cnn(),
        "digits-mlp" => digits_mlp(),
        other => Err(GraphError::UnknownZoo {
            name: other.to_string(),
            available: NAMES,
        }),
    }
}

/// The dual-input regressor: a MATLAB dlnetwork with an image branch and a feature branch.
fn seed2_dual() -> Result<Graph, GraphError> {
    let mut g = GraphBuilder::new("seed2-dual");
    g.input("image", Shape::fixed(&[26, 9, 9]))?;
    g.input("features", Shape::fixed(&[8]))?;
    g.conv("conv", "image", 26, 2, 3, 1, None)?;
    g.push("relu", Op::Relu, &["conv"])?;
    g.pool("avgpool2d", "relu", PoolKind::Avg, 2, 3, 3, None)?;
    g.push("flatten", Op::Flatten, &["avgpool2d"])?;
    g.linear("fc", "flatten", 26)?;
    g.push("relu_3", Op::Relu, &["fc"])?;
    g.push("concat", Op::Concat { axis: 1 }, &["relu_3", "features"])?;
    g.linear("fc_1", "concat", 256)?;
    g.push("relu_1", Op::Relu, &["fc_1"])?;
    g.linear("fc_2", "relu_1", 256)?;
    g.push("relu_2", Op::Relu, &["fc_2"])?;
    g.linear("fc_3", "relu_2", 1)?;
    g.finish(LossKind::Mse, "fc_3")
}

/// The speech BiLSTM: the BiRNN of silicon-valley-data-science/RNN-Tutorial (DeepSpeech
/// style). 26 MFCC with 9 context frames each side = 494 features per frame;
/// three fc layers with ReLU clipped at 20; a bidirectional BasicLSTMCell
/// (one bias vector per gate); fc 1024; fc 29 logits (28 characters + blank);
/// CTC. The tutorial's dropout is left out, as the layer list in the issue has it.
fn rnn_tutorial() -> Result<Graph, GraphError> {
    let clip = || Op::Clamp {
        min: 0.0,
        max: 20.0,
    };
    let mut g = GraphBuilder::new("rnn-tutorial");
    g.input("mfcc", Shape(vec![Dim::Seq, Dim::Fixed(494)]))?;
    g.linear("fc1", "mfcc", 1024)?;
    g.push("relu1", clip(), &["fc1"])?;
    g.linear("fc2", "relu1", 1024)?;
    g.push("relu2", clip(), &["fc2"])?;
    g.linear("fc3", "relu2", 2048)?;
    g.push("relu3", clip(), &["fc3"])?;
    g.rnn("bilstm", "relu3", Cell::Lstm, 1024, true, RnnBias::Single)?;
    g.linear("fc5", "bilstm", 1024)?;
    g.push("relu5", clip(), &["fc5"])?;
    g.linear("logits", "relu5", 29)?;
    g.finish(LossKind::Ctc { blank: 28 }, "logits")
}

fn mnist_mlp() -> Result<Graph, GraphError> {
    let mut g = GraphBuilder::new("mnist-mlp");
    g.input("image", Shape::fixed(&[784]))?;
    g.linear("fc1", "image", 512)?;
    g.push("relu1", Op::Relu, &["fc1"])?;
    g.push("drop1", Op::Dropout { p: 0.2 }, &["relu1"])?;
    g.linear("fc2", "drop1", 512)?;
    g.push("relu2", Op::Relu, &["fc2"])?;
    g.push("drop2", Op::Dropout { p: 0.2 }, &["relu2"])?;
    g.linear("fc3", "drop2", 10)?;
    g.finish(LossKind::CrossEntropy, "fc3")
}

fn mnist_cnn() -> Result<Graph, GraphError> {
    let mut g = GraphBuilder::new("mnist-cnn");
    g.input("image", Shape::fixed(&[1, 28, 28]))?;
    g.conv("conv1", "image", 32, 2, 3, 1, Some(0))?;
    g.push("relu1", Op::Relu, &["conv1"])?;
    g.conv("conv2", "relu1", 64, 2, 3, 1, Some(0))?;
    g.push("relu2", Op::Relu, &["conv2"])?;
    g.pool("pool", "relu2", PoolKind::Max, 2, 2, 2, Some(0))?;
    g.push("drop1", Op::Dropout { p: 0.25 }, &["pool"])?;
    g.push("flatten", Op::Flatten, &["drop1"])?;
    g.linear("fc1", "flatten", 128)?;
    g.push("relu3", Op::Relu, &["fc1"])?;
    g.push("drop2", Op::Dropout { p: 0.5 }, &["relu3"])?;
    g.linear("fc2", "drop2", 10)?;
    g.finish(LossKind::CrossEntropy, "fc2")
}

fn digits_mlp() -> Result<Graph, GraphError> {
    let mut g = GraphBuilder::new("digits-mlp");
    g.input("image", Shape::fixed(&[64]))?;
    g.linear("fc1", "image", 128)?;
    g.push("relu1", Op::Relu, &["fc1"])?;
    g.linear("fc2", "relu1", 64)?;
    g.push("relu2", Op::Relu, &["fc2"])?;
    g.linear("fc3", "relu2", 10)?;
    g.finish(LossKind::CrossEntropy, "fc3")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parameter counts computed by hand from each layer list.
    #[test]
    fn parameter_counts_match_hand_computation() {
        let expect = [
            // conv 26*26*9+26, fc 234*26+26, fc 34*256+256, fc 256*256+256, fc 256+1
            ("seed2-dual", 6110 + 6110 + 8960 + 65792 + 257),
            // fc 494->1024, 1024->1024, 1024->2048; BiLSTM 2*(4*1024*(2048+1024)+4*1024);
            // fc 2048->1024; fc 1024->29
            (
                "rnn-tutorial",
                506_880 + 1_049_600 + 2_099_200 + 25_174_016 + 2_098_176 + 29_725,
            ),
            ("mnist-mlp", 401_920 + 262_656 + 5_130),
            ("mnist-cnn", 320 + 18_496 + 1_179_776 + 1_290),
            ("digits-mlp", 8_320 + 8_256 + 650),
        ];
        for (name, params) in expect {
            assert_eq!(build(name).unwrap().param_count(), params, "{name}");
        }
        assert_eq!(build("seed2-dual").unwrap().param_count(), 87_229);
    }

    #[test]
    fn seed2_shapes() {
        let g = build("seed2-dual").unwrap();
        assert_eq!(
            g.shape_of("avgpool2d").unwrap().to_string(),
            "[B, 26, 3, 3]"
        );
        assert_eq!(g.shape_of("concat").unwrap().to_string(), "[B, 34]");
        assert_eq!(g.output().shape.to_string(), "[B, 1]");
    }

    #[test]
    fn unknown_name_lists_the_zoo() {
        let err = build("resnet").unwrap_err().to_string();
        assert!(
            err.contains("seed2-dual") && err.contains("resnet"),
            "{err}"
        );
    }
}
