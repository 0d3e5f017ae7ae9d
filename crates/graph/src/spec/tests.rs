use super::*;

pub const SEED2: &str = include_str!("../../../../examples/seed2-dual.toml");

#[test]
fn seed2_spec_equals_the_zoo_model() {
    let from_spec = parse(SEED2).unwrap();
    let zoo = crate::zoo::build("seed2-dual").unwrap();
    assert_eq!(from_spec.param_count(), 87_229);
    assert_eq!(from_spec.nodes, zoo.nodes);
    assert_eq!(from_spec.inputs, zoo.inputs);
}

/// Without `[loss]` the loss is chosen by the output's layout, as for an
/// ONNX export (docs/model-spec.md): logits `[B, 3]` as `kind =
/// "cross_entropy"` trains them, one output `[B, 1]` by MSE.
#[test]
fn without_a_loss_table_the_layout_chooses() {
    let spec = |out: usize, loss: &str| {
        format!(
            "[[input]]\nname = \"x\"\nshape = [4]\n[[layer]]\nname = \"fc\"\n\
             op = \"linear\"\nout_features = {out}\n{loss}"
        )
    };
    let named = parse(&spec(3, "[loss]\nkind = \"cross_entropy\"\n")).unwrap();
    let chosen = parse(&spec(3, "")).unwrap();
    assert_eq!(chosen.loss, named.loss);
    assert_ne!(chosen.loss.kind, LossKind::Mse);
    assert_eq!(parse(&spec(1, "")).unwrap().loss.kind, LossKind::Mse);
}

/// Sizes whose products would wrap around are refused by name: an input
/// of 2^32 x 2^32 values a sample, a layer of 2^21 x 2^21 weights.
#[test]
fn sizes_past_any_device_are_refused() {
    let huge = "[[input]]\nname = \"x\"\nshape = [4294967296, 4294967296]\n[[layer]]\nname = \"r\"\nop = \"relu\"\n";
    let err = parse(huge).unwrap_err().to_string();
    assert!(err.contains("`x`") && err.contains("2^40"), "{err}");
    let wide = "[[input]]\nname = \"x\"\nshape = [2097152]\n[[layer]]\nname = \"fc\"\nop = \"linear\"\nout_features = 2097152\n";
    let err = parse(wide).unwrap_err().to_string();
    assert!(err.contains("`fc`") && err.contains("weight"), "{err}");
}

/// `clamp` with one bound is unbounded on the other side; an empty range is
/// refused by layer.
#[test]
fn clamp_takes_either_bound_and_refuses_an_empty_range() {
    let spec = |bounds: &str| {
        format!(
            "[[input]]\nname = \"x\"\nshape = [4]\n[[layer]]\nname = \"c\"\n\
             op = \"clamp\"\n{bounds}\n"
        )
    };
    let g = parse(&spec("min = 1e-12")).unwrap();
    assert_eq!(
        g.nodes[0].op,
        Op::Clamp {
            min: 1e-12,
            max: f32::MAX
        }
    );
    let err = parse(&spec("min = 2.0\nmax = 1.0"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`c`") && err.contains("empty range"), "{err}");
}

/// A standardised convolution's keys; they are unknown without `standardize`.
#[test]
fn conv_standardize_keys_need_standardize() {
    let spec = |keys: &str| {
        format!(
            "[[input]]\nname = \"x\"\nshape = [2, 5, 5]\n[[layer]]\nname = \"c\"\n\
             op = \"conv2d\"\nout_channels = 3\nkernel = 3\n{keys}\n"
        )
    };
    let g = parse(&spec("standardize = true\ngain = true\ngain_scale = 0.5")).unwrap();
    let Op::Conv { standardize, .. } = &g.nodes[0].op else {
        panic!("{:?}", g.nodes[0].op)
    };
    let want = Standardize {
        eps: 1e-6,
        gain: true,
        scale: 0.5,
    };
    assert_eq!(standardize.as_ref(), Some(&want));
    // weight, bias, gain
    assert_eq!(g.param_count(), 3 * 2 * 9 + 3 + 3);
    let err = parse(&spec("gain = true")).unwrap_err().to_string();
    assert!(err.contains("gain"), "{err}");
}

#[test]
fn mismatched_shapes_name_the_layer() {
    let spec = r#"
        [[input]]
        name = "x"
        shape = [8]
        [[layer]]
        name = "a"
        op = "linear"
        out_features = 4
        [[layer]]
        name = "m"
        op = "add"
        inputs = ["a", "x"]
    "#;
    let err = parse(spec).unwrap_err().to_string();
    assert!(
        err.contains("node `m`") && err.contains("broadcast"),
        "{err}"
    );
}

#[test]
fn unknown_keys_are_errors() {
    let spec = r#"
        [[input]]
        name = "x"
        shape = [8]
        [[layer]]
        name = "a"
        op = "linear"
        out_feature = 4
    "#;
    let err = parse(spec).unwrap_err().to_string();
    assert!(err.contains("layer `a`"), "{err}");
}

#[test]
fn expand_repeats_axes_of_size_one_and_names_a_bad_target() {
    let spec = |target: &str| {
        format!(
            r#"
            [[input]]
            name = "x"
            shape = [4, 1, 1]
            [[layer]]
            name = "e"
            op = "expand"
            shape = {target}
            "#
        )
    };
    let graph = parse(&spec("[4, 3, 5]")).unwrap();
    assert_eq!(graph.shape_of("e"), Some(&Shape::fixed(&[4, 3, 5])));
    let err = parse(&spec("[2, 3, 5]")).unwrap_err().to_string();
    assert!(err.contains("`e`"), "{err}");
}
