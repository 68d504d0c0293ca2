//! The CPU mesh's `MeshOps`, one module per op family. A fine op reaches its family through
//! its call (`MeshOps::fine_op`): each family's `kernel` maps the op's name to the function
//! that reads the call's arguments and runs the maths, which sit below it in the same file.
//! The other trait methods (storage, row slicing) are forwarded from `cpu/mod.rs`. The
//! kernels they call (and their ISA variants) live beside, in `cpu/`.

pub(super) mod attention;
pub(super) mod deltanet;
pub(super) mod dense;
pub(super) mod norms;
pub(super) mod pointwise;
pub(super) mod positions;
pub(super) mod storage;

use super::{CpuMesh, CpuTensor, CpuWeight};
use crate::fine_call::FineCall;
use crate::{DeviceError, Result};

/// The maths of one fine op: its arguments read from the call, its results in order.
pub(super) type Kernel =
    fn(&CpuMesh, &FineCall<'_, CpuTensor, CpuWeight>) -> Result<Vec<CpuTensor>>;

/// Run the fine op `call` names with its family's kernel.
pub(super) fn run(
    mesh: &CpuMesh,
    call: &FineCall<'_, CpuTensor, CpuWeight>,
) -> Result<Vec<CpuTensor>> {
    let families: [fn(&str) -> Option<Kernel>; 6] = [
        dense::kernel,
        pointwise::kernel,
        norms::kernel,
        positions::kernel,
        attention::kernel,
        deltanet::kernel,
    ];
    let kernel =
        families
            .iter()
            .find_map(|family| family(call.op))
            .ok_or(DeviceError::Unsupported {
                op: call.op,
                backend: "cpu",
            })?;
    kernel(mesh, call)
}
