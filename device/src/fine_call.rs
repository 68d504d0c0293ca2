//! A fine op as one value: its name in the shim's op table (ffi/shim/core/op_table.cpp), its
//! operands in the declared order, its numeric parameters in the declared order, its one list
//! of numbers, and how many results it gives.
//!
//! The fine ops of [`MeshOps`](crate::MeshOps) build one in their default bodies (generated
//! from the op table: fine_ops.rs) and hand it to [`MeshOps::fine_op`](crate::MeshOps::fine_op):
//! the tt mesh passes it to the shim's generic `clef_tt_op` as it is, and the CPU mesh runs the
//! maths it holds for an op of that name (cpu/ops/, each family's `kernel`). So an op's encoding
//! follows from its one declaration, and every CPU test runs the encoding the shims get.

use crate::{DeviceError, Result};

/// One operand of a fine op.
pub enum Operand<'a, T, W> {
    Tensor(&'a T),
    Weight(&'a W),
    /// An optional tensor left out (a cache or a state that starts from zeros).
    Absent,
}

/// A fine op and its arguments (module header).
pub struct FineCall<'a, T, W> {
    /// The op's name in the shim's op table.
    pub op: &'static str,
    pub operands: Vec<Operand<'a, T, W>>,
    /// Numbers in the declared order: sizes, reals, flags (0 or 1) and enum codes, as f64
    /// (exact for every size below 2^53; the shim checks each against its declared type).
    pub params: Vec<f64>,
    /// The op's one list of numbers (split widths, positions, segment bounds), if it takes one.
    pub list: Vec<u32>,
    /// How many results the op gives.
    pub results: usize,
    /// The parameters the calling mesh sets from its profile (the table's `from_profile`,
    /// linear's matmul numerics): their index in `params`, which holds NaN there, and name.
    /// The tt mesh fills them; the CPU mesh computes in its own numerics and reads none.
    pub profile: Vec<(usize, &'static str)>,
}

impl<'a, T, W> FineCall<'a, T, W> {
    /// A call of `op` with no arguments yet, giving one result.
    pub fn new(op: &'static str) -> Self {
        FineCall {
            op,
            operands: Vec::new(),
            params: Vec::new(),
            list: Vec::new(),
            results: 1,
            profile: Vec::new(),
        }
    }

    pub fn tensor(mut self, t: &'a T) -> Self {
        self.operands.push(Operand::Tensor(t));
        self
    }

    pub fn weight(mut self, w: &'a W) -> Self {
        self.operands.push(Operand::Weight(w));
        self
    }

    pub fn optional(mut self, t: Option<&'a T>) -> Self {
        self.operands
            .push(t.map_or(Operand::Absent, Operand::Tensor));
        self
    }

    /// A size parameter.
    pub fn size(mut self, v: usize) -> Self {
        self.params.push(v as f64);
        self
    }

    /// A real parameter (an f32 one is exact as f64).
    pub fn real(mut self, v: f64) -> Self {
        self.params.push(v);
        self
    }

    pub fn flag(mut self, b: bool) -> Self {
        self.params.push(f64::from(u8::from(b)));
        self
    }

    /// An enum parameter by its ABI code.
    pub fn code(mut self, v: u32) -> Self {
        self.params.push(f64::from(v));
        self
    }

    /// A parameter the calling mesh sets from its profile, by its name in the op table.
    pub fn profile(mut self, name: &'static str) -> Self {
        self.profile.push((self.params.len(), name));
        self.params.push(f64::NAN);
        self
    }

    pub fn list(mut self, items: Vec<u32>) -> Self {
        self.list = items;
        self
    }

    pub fn results(mut self, n: usize) -> Self {
        self.results = n;
        self
    }

    fn refuse(&self, detail: String) -> DeviceError {
        DeviceError::Shape {
            op: self.op,
            detail,
        }
    }

    fn operand(&self, i: usize) -> Result<&Operand<'a, T, W>> {
        self.operands
            .get(i)
            .ok_or_else(|| self.refuse(format!("no operand {i}")))
    }

    /// Operand `i`, a tensor.
    pub fn tensor_at(&self, i: usize) -> Result<&'a T> {
        match self.operand(i)? {
            Operand::Tensor(t) => Ok(t),
            _ => Err(self.refuse(format!("operand {i} is not a tensor"))),
        }
    }

    /// Operand `i`, a weight.
    pub fn weight_at(&self, i: usize) -> Result<&'a W> {
        match self.operand(i)? {
            Operand::Weight(w) => Ok(w),
            _ => Err(self.refuse(format!("operand {i} is not a weight"))),
        }
    }

    /// Operand `i`, an optional tensor.
    pub fn optional_at(&self, i: usize) -> Result<Option<&'a T>> {
        match self.operand(i)? {
            Operand::Tensor(t) => Ok(Some(t)),
            Operand::Absent => Ok(None),
            Operand::Weight(_) => Err(self.refuse(format!("operand {i} is a weight"))),
        }
    }

    /// Parameter `i` as a real.
    pub fn real_at(&self, i: usize) -> Result<f64> {
        self.params
            .get(i)
            .copied()
            .ok_or_else(|| self.refuse(format!("no parameter {i}")))
    }

    /// Parameter `i` as a size (a whole number from 0 to 2^53).
    pub fn size_at(&self, i: usize) -> Result<usize> {
        let v = self.real_at(i)?;
        if v.fract() != 0.0 || !(0.0..=9_007_199_254_740_992.0).contains(&v) {
            return Err(self.refuse(format!("parameter {i} ({v}) is not a size")));
        }
        Ok(v as usize)
    }

    /// Parameter `i` as a flag.
    pub fn flag_at(&self, i: usize) -> Result<bool> {
        match self.size_at(i)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.refuse(format!("parameter {i} ({v}) is not a flag"))),
        }
    }
}

/// `values` as the u32 numbers of a list, each checked to fit (`what` names them in the error).
pub fn list_u32(
    op: &'static str,
    what: &str,
    values: impl IntoIterator<Item = usize>,
) -> Result<Vec<u32>> {
    values
        .into_iter()
        .map(|v| {
            u32::try_from(v).map_err(|_| DeviceError::Shape {
                op,
                detail: format!("{what} {v} does not fit 32 bits"),
            })
        })
        .collect()
}

/// The one result of an op that gives one.
pub fn one<T>(op: &'static str, results: Vec<T>) -> Result<T> {
    let mut it = results.into_iter();
    match (it.next(), it.next()) {
        (Some(t), None) => Ok(t),
        _ => Err(DeviceError::Shape {
            op,
            detail: "not one result".into(),
        }),
    }
}

/// The two results of an op that gives two.
pub fn two<T>(op: &'static str, results: Vec<T>) -> Result<(T, T)> {
    let mut it = results.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(a), Some(b), None) => Ok((a, b)),
        _ => Err(DeviceError::Shape {
            op,
            detail: "not two results".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_reads_back_what_it_was_built_with() {
        let (x, w) = (1u8, 2u16);
        let call: FineCall<'_, u8, u16> = FineCall::new("rms_norm")
            .tensor(&x)
            .weight(&w)
            .optional(None)
            .size(64)
            .real(1e-6)
            .flag(true)
            .results(2);
        assert_eq!(*call.tensor_at(0).unwrap(), 1);
        assert_eq!(*call.weight_at(1).unwrap(), 2);
        assert!(call.optional_at(2).unwrap().is_none());
        assert_eq!(call.size_at(0).unwrap(), 64);
        assert_eq!(call.real_at(1).unwrap(), 1e-6);
        assert!(call.flag_at(2).unwrap());
        assert_eq!(call.results, 2);
        // Wrong kinds, missing entries and non-sizes are refused, naming the op.
        assert!(call.tensor_at(1).is_err() && call.weight_at(0).is_err());
        assert!(call.tensor_at(3).is_err() && call.real_at(3).is_err());
        let e = call.size_at(1).unwrap_err().to_string();
        assert!(
            e.starts_with("rms_norm:") && e.contains("not a size"),
            "{e}"
        );
        assert!(list_u32("split_cols", "width", [1usize << 33]).is_err());
        // A parameter left to the mesh's profile keeps its place in the declared order.
        let call: FineCall<'_, u8, u16> = FineCall::new("linear").size(3).profile("fidelity");
        assert_eq!(call.profile, vec![(1, "fidelity")]);
        assert!(call.params[1].is_nan() && call.params.len() == 2);
        assert!(one("x", vec![1, 2]).is_err() && two("x", vec![1]).is_err());
        assert_eq!(two("x", vec![1, 2]).unwrap(), (1, 2));
    }
}
