//! Python-compatible JSON text: what `json.dumps(value, ensure_ascii=False, separators=(",",
//! ":"), sort_keys=...)` prints for a value parsed by Python's `json.loads`.
//!
//! Numbers keep the JSON int/float distinction of the request (serde_json is built with
//! `arbitrary_precision`, so the original token is available): an integer token stays an
//! exact integer (`-0` becomes `0`), anything with `.` or an exponent becomes an f64 printed
//! with Python's `repr` (`1e+16`, `1.5e-05`, `100.0`, `-0.0`, `Infinity`).

use serde_json::{Number, Value};

/// Compact JSON of `value`; object keys sorted by code point when `sort_keys`, else in the
/// parsed order.
pub fn dumps(value: &Value, sort_keys: bool) -> String {
    let mut out = String::new();
    write_value(&mut out, value, sort_keys);
    out
}

fn write_value(out: &mut String, value: &Value, sort_keys: bool) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number_text(n)),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item, sort_keys);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if sort_keys {
                // Rust string order is UTF-8 byte order, which equals code-point order.
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_value(out, v, sort_keys);
            }
            out.push('}');
        }
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Whether a number token is a JSON integer (no fraction, no exponent).
pub fn is_integer_token(text: &str) -> bool {
    !text.contains(['.', 'e', 'E'])
}

/// The text Python prints for a parsed JSON number.
pub fn number_text(n: &Number) -> String {
    let text = n.to_string();
    if is_integer_token(&text) {
        // Python's int() of the token: exact, and "-0" is 0.
        if text.trim_start_matches('-').chars().all(|c| c == '0') {
            return "0".to_string();
        }
        text
    } else {
        // An overflowing literal such as 1e400 parses to infinity, as in Python.
        let v: f64 = text.parse().unwrap_or(f64::NAN);
        float_repr(v)
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional when the decimal
/// exponent is in [-4, 16), else `d.ddde±XX`.
pub fn float_repr(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= 0 {
            let int_len = exp + 1;
            if n <= int_len {
                format!("{digits}{}.0", "0".repeat((int_len - n) as usize))
            } else {
                format!(
                    "{}.{}",
                    &digits[..int_len as usize],
                    &digits[int_len as usize..]
                )
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let es = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

/// Python's `round(x, 4)`: the double nearest to the correctly rounded decimal (ties to even on
/// the exact binary value, as `{:.4}` does).
pub fn round4(x: f64) -> f64 {
    if !x.is_finite() {
        return x;
    }
    format!("{x:.4}").parse().unwrap_or(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (v, want) in [
            (1.0, "1.0"),
            (100.0, "100.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (2.5e-7, "2.5e-07"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (-12.5, "-12.5"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e-7, "1e-07"),
            (123456.789, "123456.789"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(float_repr(v), want, "{v}");
        }
    }

    #[test]
    fn round4_is_pythons_round() {
        assert_eq!(round4(0.86505), 0.865);
        assert_eq!(round4(0.00015), 0.0001);
        assert_eq!(round4(0.91546), 0.9155);
    }
}
