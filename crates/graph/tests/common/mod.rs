//! Writing ONNX models in tests: a small builder over the proto messages,
//! tensor and attribute helpers, and question 2's network as MATLAB exports it.

// Each test file uses only some of these helpers.
#![allow(dead_code)]

use batchfit_graph::onnx::proto::tensor_shape_proto::{Dimension, dimension};
use batchfit_graph::onnx::proto::{
    AttributeProto, AttributeType, DataType, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, type_proto,
};
use prost::Message;
use std::path::PathBuf;

// ----- model writing helpers ------------------------------------------------

/// A graph under construction.
#[derive(Clone, Default)]
pub struct Net {
    pub g: GraphProto,
}

impl Net {
    pub fn new(name: &str) -> Net {
        let mut net = Net::default();
        net.g.name = name.into();
        net
    }

    /// A graph input; `dims` like "batch,26,9,9" (numbers are sizes, words are symbolic).
    pub fn input(&mut self, name: &str, dims: &str) -> &mut Self {
        self.input_of(name, dims, DataType::Float)
    }

    pub fn input_of(&mut self, name: &str, dims: &str, elem: DataType) -> &mut Self {
        self.g.input.push(value_info(name, dims, elem));
        self
    }

    pub fn output(&mut self, name: &str) -> &mut Self {
        self.g.output.push(ValueInfoProto {
            name: name.into(),
            ..Default::default()
        });
        self
    }

    /// A float initializer of zeros.
    pub fn weight(&mut self, name: &str, dims: &[i64]) -> &mut Self {
        self.g.initializer.push(zeros(name, dims));
        self
    }

    pub fn init(&mut self, t: TensorProto) -> &mut Self {
        self.g.initializer.push(t);
        self
    }

    pub fn node(
        &mut self,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> &mut Self {
        self.g.node.push(NodeProto {
            op_type: op.into(),
            name: name.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        });
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        model_bytes(self.g.clone(), 17)
    }
}

pub fn model_bytes(graph: GraphProto, opset: i64) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        producer_name: "batchfit-tests".into(),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

pub fn value_info(name: &str, dims: &str, elem: DataType) -> ValueInfoProto {
    let dim = dims
        .split(',')
        .map(|d| Dimension {
            value: Some(match d.trim().parse::<i64>() {
                Ok(v) => dimension::Value::DimValue(v),
                Err(_) => dimension::Value::DimParam(d.trim().into()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem as i32,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn zeros(name: &str, dims: &[i64]) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        raw_data: vec![0; 4 * n as usize],
        ..Default::default()
    }
}

pub fn int64s(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![values.len() as i64],
        data_type: DataType::Int64 as i32,
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

pub fn scalar(name: &str, v: f32) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: DataType::Float as i32,
        float_data: vec![v],
        ..Default::default()
    }
}

pub fn attr(name: &str, kind: AttributeType) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: kind as i32,
        ..Default::default()
    }
}

pub fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        i: v,
        ..attr(name, AttributeType::Int)
    }
}

pub fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: v.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}

pub fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        s: v.as_bytes().to_vec(),
        ..attr(name, AttributeType::String)
    }
}

pub fn tensor(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        t: Some(t),
        ..attr(name, AttributeType::Tensor)
    }
}

/// A fresh temporary directory for this test.
pub fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("batchfit-onnx-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ----- models ---------------------------------------------------------------

/// Question 2's network as MATLAB's exportONNXNetwork would write it, with node
/// names equal to the zoo's and tensor names different from them.
pub fn seed2() -> Net {
    let mut n = Net::new("seed2-dual");
    n.input("image", "batch,26,9,9")
        .input("features", "batch,8");
    n.weight("conv.W", &[26, 26, 3, 3]).weight("conv.B", &[26]);
    n.node(
        "Conv",
        "conv",
        &["image", "conv.W", "conv.B"],
        &["t_conv"],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("pads", &[1, 1, 1, 1]),
            ints("strides", &[1, 1]),
        ],
    );
    n.node("Relu", "relu", &["t_conv"], &["t_relu"], vec![]);
    n.node(
        "AveragePool",
        "avgpool2d",
        &["t_relu"],
        &["t_pool"],
        vec![ints("kernel_shape", &[3, 3]), ints("strides", &[3, 3])],
    );
    n.node(
        "Flatten",
        "flatten",
        &["t_pool"],
        &["t_flat"],
        vec![int("axis", 1)],
    );
    let fc = |n: &mut Net, name: &str, x: &str, out: &str, k: i64, m: i64| {
        let (w, b) = (format!("{name}.W"), format!("{name}.B"));
        n.weight(&w, &[m, k]).weight(&b, &[m]);
        n.node("Gemm", name, &[x, &w, &b], &[out], vec![int("transB", 1)]);
    };
    fc(&mut n, "fc", "t_flat", "t_fc", 234, 26);
    n.node("Relu", "relu_3", &["t_fc"], &["t_relu3"], vec![]);
    n.node(
        "Concat",
        "concat",
        &["t_relu3", "features"],
        &["t_cat"],
        vec![int("axis", 1)],
    );
    fc(&mut n, "fc_1", "t_cat", "t_fc1", 34, 256);
    n.node("Relu", "relu_1", &["t_fc1"], &["t_relu1"], vec![]);
    fc(&mut n, "fc_2", "t_relu1", "t_fc2", 256, 256);
    n.node("Relu", "relu_2", &["t_fc2"], &["t_relu2"], vec![]);
    fc(&mut n, "fc_3", "t_relu2", "prediction", 256, 1);
    n.output("prediction");
    n
}

/// An int64 initializer of `dims` with these values.
pub fn int64_tensor(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Int64 as i32,
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

/// A float initializer with these values in `float_data`.
pub fn floats(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        float_data: values.to_vec(),
        ..Default::default()
    }
}

/// A float initializer with these values little-endian in `raw_data`.
pub fn raw_floats(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

pub fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        f: v,
        ..attr(name, AttributeType::Float)
    }
}

/// `[B, rest..]` from the batch of input `x` (`Shape`, `Slice` to its first entry,
/// `Concat`), named `target`: an `expand(B, ...)` or `repeat(B, ...)`'s sizes.
pub fn batch_and(n: &mut Net, x: &str, rest: &[i64], target: &str) {
    let p = format!("/{target}");
    n.init(int64s(&format!("{target}.zero"), &[0]))
        .init(int64s(&format!("{target}.one"), &[1]))
        .init(int64s(&format!("{target}.rest"), rest));
    n.node(
        "Shape",
        &format!("{p}/shape"),
        &[x],
        &[&format!("{target}.shape")],
        vec![],
    );
    n.node(
        "Slice",
        &format!("{p}/batch"),
        &[
            &format!("{target}.shape"),
            &format!("{target}.zero"),
            &format!("{target}.one"),
        ],
        &[&format!("{target}.b")],
        vec![],
    );
    n.node(
        "Concat",
        &format!("{p}/concat"),
        &[&format!("{target}.b"), &format!("{target}.rest")],
        &[target],
        vec![int("axis", 0)],
    );
}
