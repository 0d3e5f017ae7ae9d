use super::*;

#[test]
fn idx_roundtrip() {
    // 2 x 3 unsigned bytes.
    let mut b = vec![0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3];
    b.extend([1, 2, 3, 4, 5, 6]);
    let a = idx_bytes(&b).unwrap();
    assert_eq!(a.shape, vec![2, 3]);
    assert_eq!(a.values, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert!(idx_bytes(&b[..14]).is_err());
    assert!(idx_bytes(b"PK\x03\x04").is_err());
}

#[test]
fn a_field_that_is_not_a_number_is_named_by_row_and_column() {
    let missing = "bill,mass,species\n39.1,3750,0\n,3800,0\n".as_bytes();
    let why = csv_bytes(missing, None).unwrap_err().to_string();
    assert!(
        why.contains("row 2 (line 3), column 1 (`bill`) is empty: a missing value"),
        "{why}"
    );
    let word = "1,2,0\n1,two,1\n".as_bytes();
    let why = csv_bytes(word, None).unwrap_err().to_string();
    assert!(
        why.contains("row 2, column 2: `two` is not a number"),
        "{why}"
    );
    // A name in the label column is a class; an empty one is still missing.
    let empty_label = "1,2,setosa\n1,3,\n".as_bytes();
    let why = csv_bytes(empty_label, None).unwrap_err().to_string();
    assert!(why.contains("row 2, column 3 is empty"), "{why}");
}

/// Class names in the label column, as UCI's iris and palmerpenguins ship
/// them: numbered in sorted order, with or without a header, in any column.
#[test]
fn class_names_in_the_label_column_are_numbered_in_sorted_order() {
    let with_header = "sepal,petal,species\n5.1,1.4,setosa\n7.0,4.7,versicolor\n5.0,1.3,setosa\n6.3,6.0,virginica\n";
    let c = csv_bytes(with_header.as_bytes(), None).unwrap();
    assert_eq!(
        c.classes.as_deref(),
        Some(&["setosa", "versicolor", "virginica"].map(String::from)[..])
    );
    assert_eq!(c.y.values, vec![0.0, 1.0, 0.0, 2.0]);
    assert!(c.y.integral);
    assert_eq!((c.x.shape.clone(), c.x.values[2]), (vec![4, 2], 7.0));
    // No header, the label first, a stray space: the same classes.
    let first = "Gentoo, 46.1\nAdelie, 39.1\n".as_bytes();
    let c = csv_bytes(first, Some(&LabelCol::Index(0))).unwrap();
    assert_eq!(c.classes.unwrap(), vec!["Adelie", "Gentoo"]);
    assert_eq!((c.y.values, c.x.values), (vec![1.0, 0.0], vec![46.1, 39.1]));
    // A header whose feature names are numbers over numeric labels stays a header.
    let numbered = "0,1,label\n0.5,0.25,1\n0.75,0.5,0\n".as_bytes();
    let c = csv_bytes(numbered, None).unwrap();
    assert_eq!((c.classes, c.y.values), (None, vec![1.0, 0.0]));
    assert_eq!(c.x.values, vec![0.5, 0.25, 0.75, 0.5]);
    // Years for feature names over class names (tidyr's world_bank_pop):
    // a header, since its label names no row below and each name below
    // names two.
    let years = "2000,2001,indicator\n1.5,2,SP.POP.TOTL\n3,4,SP.URB.TOTL\n5,6,SP.POP.TOTL\n7,8,SP.URB.TOTL\n";
    let c = csv_bytes(years.as_bytes(), None).unwrap();
    assert_eq!(c.classes.unwrap(), vec!["SP.POP.TOTL", "SP.URB.TOTL"]);
    assert_eq!(
        (c.x.shape, c.y.values),
        (vec![4, 2], vec![0.0, 1.0, 0.0, 1.0])
    );
    // Semicolons (UCI's wine-quality files) and tabs separate fields too.
    let semi = "fixed acidity;pH;quality\n7.4;3.51;5\n7.8;3.2;6\n".as_bytes();
    let c = csv_bytes(semi, None).unwrap();
    assert_eq!(
        (c.x.values, c.y.values),
        (vec![7.4, 3.51, 7.8, 3.2], vec![5.0, 6.0])
    );
    let tabs = "a\tb\ty\n1\t2\t0\n".as_bytes();
    assert_eq!(csv_bytes(tabs, None).unwrap().x.values, vec![1.0, 2.0]);
    // A first row of numbers with a missing value is data, and says so;
    // `NA` and `?` are missing values, not categories.
    for (text, field) in [
        ("1.5,?,3,1\n2.5,3,4,0\n", "?"),
        ("1.5,NA,3,1\n2,3,4,0\n", "NA"),
    ] {
        let why = csv_bytes(text.as_bytes(), None).unwrap_err().to_string();
        assert!(
            why.contains(&format!("row 1, column 2: `{field}` marks a missing value")),
            "{why}"
        );
    }
    let na = "a,b,y\n1,2,0\n3,NA,1\n".as_bytes();
    let why = csv_bytes(na, None).unwrap_err().to_string();
    assert!(
        why.contains("row 2 (line 3), column 2 (`b`): `NA` marks a missing value"),
        "{why}"
    );
    // A byte-order mark before the first field is not part of it.
    let bom = b"\xEF\xBB\xBF1.5,2,0\n2.5,3,1\n";
    assert_eq!(
        csv_bytes(bom, None).unwrap().x.values,
        vec![1.5, 2.0, 2.5, 3.0]
    );
    // Booleans, as R and pandas write them, are 1 and 0.
    let bools = "TRUE,2.5,0\nFalse,1,1\n".as_bytes();
    assert_eq!(
        csv_bytes(bools, None).unwrap().x.values,
        vec![1.0, 2.5, 0.0, 1.0]
    );
    // A header naming a column other than the last the label, with no
    // --label-col: refused, naming the column; --label-col decides.
    let label_first = "label,p1,p2\n3,0,0\n7,255,0\n".as_bytes();
    let why = csv_bytes(label_first, None).unwrap_err().to_string();
    assert!(
        why.contains("column 1 `label`") && why.contains("--label-col 0"),
        "{why}"
    );
    let c = csv_bytes(label_first, Some(&LabelCol::Index(0))).unwrap();
    assert_eq!((c.y.values, c.x.shape), (vec![3.0, 7.0], vec![2, 2]));
    assert_eq!(
        csv_bytes(label_first, Some(&LabelCol::Index(-1)))
            .unwrap()
            .y
            .values,
        vec![0.0, 0.0]
    );
    // The label column by its header name, anywhere; a name the header
    // does not hold is refused, quoting the first row.
    let named = LabelCol::Name("label".into());
    let c = csv_bytes(label_first, Some(&named)).unwrap();
    assert_eq!((c.y.values, c.x.shape), (vec![3.0, 7.0], vec![2, 2]));
    let why = csv_bytes(label_first, Some(&LabelCol::Name("class".into())))
        .unwrap_err()
        .to_string();
    assert!(
        why.contains(
            "--label-col class: the first row names no column so (it reads label, p1, p2)"
        ),
        "{why}"
    );
    // A first row whose class recurs below is data.
    let data = "1,2,a\n3,4,b\n5,6,a\n7,8,b\n".as_bytes();
    assert_eq!(csv_bytes(data, None).unwrap().y.values.len(), 4);
}
