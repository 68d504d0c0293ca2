//! Mesh shapes: how many devices a worker drives and how they are arranged.

use crate::DeviceError;
use std::fmt;
use std::str::FromStr;

/// A 2-D mesh of devices, `rows x cols`. clef-tt uses line meshes (one row): 1x1, 1x2, and a
/// 1x4 parent that is split into 1x2 submeshes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MeshShape {
    pub rows: usize,
    pub cols: usize,
}

impl MeshShape {
    pub const ONE: MeshShape = MeshShape { rows: 1, cols: 1 };
    pub const PAIR: MeshShape = MeshShape { rows: 1, cols: 2 };

    /// Number of devices in the mesh (the tensor-parallel degree on a line mesh).
    pub fn devices(&self) -> usize {
        self.rows * self.cols
    }

    /// Split a parent mesh into equal submeshes of `sub` (a 1x4 parent gives two 1x2 groups).
    pub fn submeshes(&self, sub: MeshShape) -> Result<usize, DeviceError> {
        if sub.rows != self.rows || sub.cols == 0 || !self.cols.is_multiple_of(sub.cols) {
            return Err(DeviceError::Mesh(format!("{sub} inside {self}")));
        }
        Ok(self.cols / sub.cols)
    }
}

impl fmt::Display for MeshShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.rows, self.cols)
    }
}

impl FromStr for MeshShape {
    type Err = DeviceError;

    /// Parses `1x2`, `(1, 2)` or `1,2`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let cleaned: String = s
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '(' && *c != ')')
            .collect();
        let mut parts = cleaned.split(['x', 'X', ',']);
        let parse = |p: Option<&str>| p.and_then(|v| v.parse::<usize>().ok());
        match (parse(parts.next()), parse(parts.next()), parts.next()) {
            (Some(1), Some(cols @ (1 | 2 | 4)), None) => Ok(MeshShape { rows: 1, cols }),
            _ => Err(DeviceError::Mesh(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_spellings_of_the_port() {
        assert_eq!("1x2".parse::<MeshShape>().unwrap(), MeshShape::PAIR);
        assert_eq!("(1, 2)".parse::<MeshShape>().unwrap(), MeshShape::PAIR);
        assert_eq!("1,1".parse::<MeshShape>().unwrap(), MeshShape::ONE);
        assert!("2x2".parse::<MeshShape>().is_err());
        assert!("1x3".parse::<MeshShape>().is_err());
        assert!("banana".parse::<MeshShape>().is_err());
    }

    #[test]
    fn a_1x4_parent_holds_two_pairs() {
        let parent: MeshShape = "1x4".parse().unwrap();
        assert_eq!(parent.submeshes(MeshShape::PAIR).unwrap(), 2);
        assert!(MeshShape::PAIR.submeshes(parent).is_err());
    }
}
