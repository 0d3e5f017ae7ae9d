use super::*;
use batchfit_graph::zoo;

#[test]
fn shipped_digits_bind_to_digits_mlp() {
    let g = zoo::build("digits-mlp").unwrap();
    let d = digits::load(&g).unwrap();
    assert_eq!(d.rows, 1797);
    assert_eq!(d.input_elems, vec![64]);
    match &d.targets {
        Targets::Classes {
            labels, classes, ..
        } => {
            assert_eq!(*classes, 10);
            assert!(labels.iter().all(|&l| l < 10));
            assert_eq!(labels[..3], [0, 1, 2]);
        }
        _ => panic!("classification"),
    }
    assert!(d.inputs[0].iter().all(|&v| (0.0..=1.0).contains(&v)));
}

/// `split_rows` names the rows `split`'s subsets hold, in their order,
/// and every row once.
#[test]
fn split_rows_are_the_rows_of_the_split() {
    let g = zoo::build("digits-mlp").unwrap();
    let d = digits::load(&g).unwrap();
    let (train, val) = d.split(0.1, 7);
    let (train_rows, val_rows) = d.split_rows(0.1, 7);
    assert_eq!((train_rows.len(), val_rows.len()), (train.rows, val.rows));
    assert_eq!(
        train.gather_input(0, &[3]),
        d.gather_input(0, &[train_rows[3]])
    );
    assert_eq!(val.gather_input(0, &[5]), d.gather_input(0, &[val_rows[5]]));
    let mut all: Vec<usize> = train_rows.into_iter().chain(val_rows).collect();
    all.sort_unstable();
    assert_eq!(all, (0..d.rows).collect::<Vec<_>>());
}

/// An archive as Keras's `mnist.npz` ships (`x_train`, `y_train`,
/// `x_test`, `y_test`) binds its training split.
#[test]
fn a_keras_archive_binds_its_training_split() {
    let g = zoo::build("digits-mlp").unwrap();
    let array = |rows: usize, row: &[usize], v: f32| Array {
        shape: [&[rows][..], row].concat(),
        values: vec![v; rows * row.iter().product::<usize>()],
        integral: true,
    };
    let arrays = vec![
        ("x_train".to_string(), array(5, &[8, 8], 1.0)),
        ("y_train".to_string(), array(5, &[], 3.0)),
        ("x_test".to_string(), array(2, &[8, 8], 2.0)),
        ("y_test".to_string(), array(2, &[], 4.0)),
    ];
    let d = Dataset::bind("mnist.npz", arrays, &g, 1).unwrap();
    assert_eq!((d.rows, d.inputs[0][0]), (5, 1.0));
    match &d.targets {
        Targets::Classes { labels, .. } => assert_eq!(labels, &vec![3; 5]),
        _ => panic!("classification"),
    }
}

/// One-hot labels (Keras's `to_categorical`) are their classes; a row
/// that is not one-hot (label smoothing) is refused, naming it.
#[test]
fn one_hot_labels_are_their_classes() {
    let g = zoo::build("digits-mlp").unwrap();
    let bind = |y: Vec<f32>| {
        let arrays = vec![
            (
                "x".to_string(),
                Array {
                    shape: vec![2, 64],
                    values: vec![0.5; 128],
                    integral: false,
                },
            ),
            (
                "y".to_string(),
                Array {
                    shape: vec![2, 10],
                    values: y,
                    integral: false,
                },
            ),
        ];
        Dataset::bind("onehot.npz", arrays, &g, 1)
    };
    let mut y = vec![0.0; 20];
    (y[3], y[17]) = (1.0, 1.0);
    match bind(y.clone()).unwrap().targets {
        Targets::Classes { labels, .. } => assert_eq!(labels, vec![3, 7]),
        _ => panic!("classification"),
    }
    y[12] = 0.1;
    let why = bind(y).unwrap_err().to_string();
    assert!(
        why.contains("row 2: 10 values a label are read as one-hot"),
        "{why}"
    );
}

/// Targets from a file of their own (`--labels`): what is wrong with them
/// names that file, not the features'.
#[test]
fn a_labels_file_is_named_for_its_own_errors() {
    let g = zoo::build("digits-mlp").unwrap();
    let array = |shape: Vec<usize>, values: Vec<f32>| Array {
        shape,
        values,
        integral: true,
    };
    let arrays = vec![
        ("x".to_string(), array(vec![2, 64], vec![0.5; 128])),
        ("target".to_string(), array(vec![2], vec![1.0, 12.0])),
    ];
    let why = Dataset::bind_from("x-idx3-ubyte", Some("y-idx1-ubyte"), arrays, &g, 1)
        .unwrap_err()
        .to_string();
    assert!(
        why.starts_with("y-idx1-ubyte") && why.contains("label 12"),
        "{why}"
    );
}

/// A [T = 6, C = 5] CTC model over 4 features a frame, blank 0.
fn ctc_model() -> Graph {
    batchfit_graph::spec::parse(
        "[[input]]\nname = \"x\"\nshape = [6, 4]\n[[layer]]\nname = \"fc\"\n\
         op = \"linear\"\nout_features = 5\n[loss]\nkind = \"ctc\"\n",
    )
    .unwrap()
}

fn bind_labels(rows: &[&[f32]]) -> Result<Dataset, String> {
    let width = rows[0].len();
    let arrays = vec![
        (
            "x".to_string(),
            Array {
                shape: vec![rows.len(), 6, 4],
                values: vec![0.5; rows.len() * 24],
                integral: false,
            },
        ),
        (
            "target".to_string(),
            Array {
                shape: vec![rows.len(), width],
                values: rows.concat(),
                integral: true,
            },
        ),
    ];
    Dataset::bind("speech.npz", arrays, &ctc_model(), 6).map_err(|e| {
        let mut why = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            why.push_str(&format!(": {s}"));
            source = s.source();
        }
        why
    })
}

#[test]
fn ctc_targets_are_label_rows_padded_with_negatives() {
    let d = bind_labels(&[&[1.0, 2.0, 2.0, -1.0], &[4.0, -1.0, -1.0, -1.0]]).unwrap();
    match &d.targets {
        Targets::Sequences {
            labels,
            width,
            lengths,
            classes,
            blank,
        } => {
            assert_eq!((*width, *classes, *blank), (4, 5, 0));
            assert_eq!(lengths, &[3, 1]);
            assert_eq!(labels, &[1, 2, 2, 0, 4, 0, 0, 0]);
        }
        other => panic!("{other:?}"),
    }
    // A subset keeps each row's labels with its length.
    match d.subset(&[1]).targets {
        Targets::Sequences {
            labels, lengths, ..
        } => {
            assert_eq!((labels, lengths), (vec![4, 0, 0, 0], vec![1]));
        }
        other => panic!("{other:?}"),
    }
    let refused = |rows: &[&[f32]], says: &str| {
        let err = bind_labels(rows).unwrap_err();
        assert!(err.contains(says), "{err}");
    };
    refused(
        &[&[1.0, -1.0, 2.0]],
        "row 1: label 2 at position 3 follows the padding",
    );
    refused(&[&[1.0, 2.0], &[-1.0, -1.0]], "row 2: no label");
    refused(&[&[0.0, 1.0]], "label 0 is the blank");
    refused(&[&[5.0]], "label 5 is not a class");
    // Six frames hold 1 1 1 1 only with a blank between each repeat: seven.
    refused(
        &[&[1.0, 1.0, 1.0, 1.0]],
        "need 7 frames, the model outputs 6",
    );
}

#[test]
fn batcher_covers_each_epoch_once() {
    let mut b = Batcher::new(10, 1);
    let mut seen: Vec<usize> = (0..5).flat_map(|_| b.next(2)).collect();
    seen.sort();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    let _ = b.next(2);
    assert_eq!(b.epoch, 1);
}
