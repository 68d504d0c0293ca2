//! Renders `device/src/fine_ops.rs` from the op table the shim lists (`clef_tt_op_table`): the
//! fine-op methods of `MeshOps`, each a typed signature and a default body that encodes the
//! call in the declared order. The table is the one declaration of a fine op; what Rust needs
//! of it is mechanical, so it is generated rather than written by hand beside it.
//!
//! The mapping: an activation or partial-sums operand is `&Self::Tensor` (`Option<..>` when it
//! may be absent), a vector or matrix operand `&Self::Weight`; a `u32` parameter is a `usize`,
//! `f32` and `f64` the same, a flag a `bool`, a GELU kind a `Gelu`; a parameter the mesh sets
//! from its profile is no argument (the call marks its place for the mesh); the list is a `&[u32]`; one result is a tensor, two a pair, one
//! per list entry a `Vec`.

use serde_json::Value;

/// The generated file's text for the table's JSON.
pub fn fine_ops_rs(table_json: &str) -> String {
    let table: Value = serde_json::from_str(table_json).expect("the op table's JSON parses");
    let ops = table.as_array().expect("the op table is a list");
    let mut out = String::from(HEADER);
    for op in ops {
        out += &method(op);
    }
    out += FOOTER;
    out
}

const HEADER: &str = "\
//! The fine ops of [`MeshOps`](crate::MeshOps), generated from the shim's op table
//! (`ffi/shim/core/op_table.cpp`, listed by `clef_tt_op_table`) by
//! `ffi/tests/generate/mod.rs`. Do not edit: change the table, then regenerate with
//! `CLEF_TT_REGENERATE=1 cargo test -p clef-tt-abi --test op_declarations` (the same test fails
//! while this file differs from what the table gives).
//!
//! Each method's default body is the op's encoding: its operands and parameters in the order
//! the table declares them, handed to the backend's one method `MeshOps::fine_op`.

/// The fine-op methods, expanded inside the `MeshOps` trait (ops.rs).
#[rustfmt::skip]
macro_rules! fine_ops {
    () => {
";

const FOOTER: &str = "    };
}

pub(crate) use fine_ops;
";

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

fn list<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// One method: its doc, signature and body, indented for the macro's body.
fn method(op: &Value) -> String {
    let name = text(op, "name");
    let mut args = vec!["&self".to_string()];
    let mut encoding = vec![format!("$crate::fine_call::FineCall::new(\"{name}\")")];
    for input in list(op, "inputs") {
        let arg = text(input, "name");
        let optional = input["optional"].as_bool() == Some(true);
        match (text(input, "kind"), optional) {
            ("activation" | "partial_sums", false) => {
                args.push(format!("{arg}: &Self::Tensor"));
                encoding.push(format!(".tensor({arg})"));
            }
            ("activation" | "partial_sums", true) => {
                args.push(format!("{arg}: Option<&Self::Tensor>"));
                encoding.push(format!(".optional({arg})"));
            }
            ("vector" | "matrix", false) => {
                args.push(format!("{arg}: &Self::Weight"));
                encoding.push(format!(".weight({arg})"));
            }
            (kind, _) => panic!("{name}: no Rust type for a {kind} operand (optional {optional})"),
        }
    }
    for param in list(op, "params") {
        let arg = text(param, "name");
        if param["from_profile"].as_bool() == Some(true) {
            encoding.push(format!(".profile(\"{arg}\")"));
            continue;
        }
        let (ty, encoded) = match text(param, "type") {
            "u32" => ("usize", format!(".size({arg})")),
            "f32" => ("f32", format!(".real(f64::from({arg}))")),
            "f64" => ("f64", format!(".real({arg})")),
            "flag" => ("bool", format!(".flag({arg})")),
            "gelu_kind" => ("$crate::Gelu", format!(".code({arg}.code())")),
            other => panic!("{name}: no Rust type for a {other} parameter {arg}"),
        };
        args.push(format!("{arg}: {ty}"));
        encoding.push(encoded);
    }
    let list_name = op["list"].as_str();
    if let Some(l) = list_name {
        args.push(format!("{l}: &[u32]"));
        encoding.push(format!(".list({l}.to_vec())"));
    }
    let results = list(op, "results").len();
    let per_entry = op["results_per_list_entry"].as_bool() == Some(true);
    let (returns, finish) = match (per_entry, list_name, results) {
        (true, Some(l), 1) => {
            encoding.push(format!(".results({l}.len())"));
            ("Vec<Self::Tensor>", "self.fine_op(&call)".to_string())
        }
        (false, _, 1) => (
            "Self::Tensor",
            "$crate::fine_call::one(call.op, self.fine_op(&call)?)".to_string(),
        ),
        (false, _, 2) => {
            encoding.push(".results(2)".to_string());
            (
                "(Self::Tensor, Self::Tensor)",
                "$crate::fine_call::two(call.op, self.fine_op(&call)?)".to_string(),
            )
        }
        _ => panic!("{name}: no Rust return type for {results} results (per entry {per_entry})"),
    };

    let mut out = String::new();
    for line in wrap(text(op, "doc"), 100 - 12) {
        out += &format!("        /// {line}\n");
    }
    if args.len() > 7 {
        out += "        #[allow(clippy::too_many_arguments)]\n";
    }
    let ret = format!("$crate::Result<{returns}>");
    let one_line = format!("        fn {name}({}) -> {ret} {{", args.join(", "));
    if one_line.len() <= 100 {
        out += &one_line;
        out += "\n";
    } else {
        out += &format!("        fn {name}(\n");
        for a in &args {
            out += &format!("            {a},\n");
        }
        out += &format!("        ) -> {ret} {{\n");
    }
    out += &format!("            let call = {}", encoding[0]);
    for e in &encoding[1..] {
        out += &format!("\n                {e}");
    }
    out += ";\n";
    out += &format!("            {finish}\n        }}\n");
    out
}

/// `doc` in lines of at most `width` characters, broken at spaces.
fn wrap(doc: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in doc.split_whitespace() {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}
