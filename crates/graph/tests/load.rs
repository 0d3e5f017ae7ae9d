//! The crate's entry point on bad model arguments: the message a user sees
//! names the file and says what is wrong, and the cause stays reachable
//! through `Error::source`.

use batchfit_graph::{GraphError, load, zoo};
use std::error::Error;

fn temp_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("batchfit-load-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn unknown_zoo_and_unknown_extension_list_the_zoo() {
    let err = load("zoo:nope").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("unknown zoo model `nope`; available: ") && msg.contains(zoo::NAMES[0]),
        "{msg}"
    );
    let msg = load("model.h5").unwrap_err().to_string();
    assert!(
        msg.starts_with("model.h5: not a model: give zoo:NAME (")
            && msg.contains(&zoo::NAMES.join(", ")),
        "{msg}"
    );
}

#[test]
fn spec_errors_name_the_file_and_keep_the_cause() {
    let dir = temp_dir("spec");
    let missing = dir.join("missing.toml");
    let err = load(missing.to_str().unwrap()).unwrap_err();
    assert!(matches!(&err, GraphError::Io { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("missing.toml") && msg.contains("cannot read"),
        "{msg}"
    );
    assert!(err.source().is_some_and(|s| s.is::<std::io::Error>()));

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "name = \n").unwrap();
    let err = load(bad.to_str().unwrap()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("{}: not valid TOML: ", bad.display())),
        "{msg}"
    );
    assert!(matches!(&err, GraphError::InFile { source, .. }
        if matches!(**source, GraphError::Toml { .. })));
    let inner = err.source().expect("the spec's error");
    assert!(inner.to_string().starts_with("not valid TOML: "));
    assert!(inner.source().is_some_and(|s| s.is::<toml::de::Error>()));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn undecodable_onnx_keeps_the_decode_error() {
    let dir = temp_dir("onnx");
    let path = dir.join("text.onnx");
    std::fs::write(&path, b"this is not an onnx model\n").unwrap();
    let err = load(path.to_str().unwrap()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "{}: not a valid ONNX model: cannot decode: ",
            path.display()
        )),
        "{msg}"
    );
    let inner = err.source().expect("the decode error");
    assert!(inner.source().is_some_and(|s| s.is::<prost::DecodeError>()));
    std::fs::remove_dir_all(dir).unwrap();
}
