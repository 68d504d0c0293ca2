//! Row tables: the rows of a `[rows, cols]` checkpoint matrix read on demand after loading (the
//! LM head's rows for option vectors, the embeddings for prompt tokens; they never leave the
//! host and are too large to copy). Rows are read with positioned reads from the file opened at
//! load, not through the memory map: a snapshot replaced the usual way (new files renamed into
//! place, as the Hugging Face cache and `clef-tt convert` do) keeps serving what was loaded,
//! and a file truncated or rewritten in place is caught by its size and modification time and
//! gives an error, where a read through the map would kill the process (SIGBUS) or return
//! other weights silently.

use super::tensors::{widen_f32, StoredDtype, TensorStore};
use super::CheckpointError;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

/// Why rows could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RowError {
    #[error("row {row} (item {at}) is outside the table of {rows} rows")]
    OutOfRange { row: usize, at: usize, rows: usize },
    #[error(
        "{file} changed on disk after the server loaded it (size or modification time); \
         restart the server to load the new weights"
    )]
    Changed { file: String },
    #[error("{file}: {msg}")]
    Io { file: String, msg: String },
}

/// What identifies a file's content cheaply: its length and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(file: &File) -> std::io::Result<Stamp> {
        let meta = file.metadata()?;
        Ok(Stamp {
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// Rows of a `[rows, cols]` matrix stored in one safetensors file.
#[derive(Clone)]
pub struct RowTable {
    file: Arc<File>,
    path: PathBuf,
    stamp: Stamp,
    /// Byte offset of row 0 in the file.
    offset: u64,
    dtype: StoredDtype,
    rows: usize,
    cols: usize,
}

impl RowTable {
    /// The tensor `name` of `store`, checked to be `[rows, cols]`.
    pub fn new(
        store: &TensorStore,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Self, CheckpointError> {
        let info = store.expect(name, &[rows, cols])?;
        let file = store.file_handle(info.file);
        let path = store.file_path(info.file).to_path_buf();
        let stamp = Stamp::of(&file).map_err(|e| CheckpointError::Io {
            file: path.display().to_string(),
            msg: e.to_string(),
        })?;
        Ok(RowTable {
            file,
            path,
            stamp,
            offset: info.start as u64,
            dtype: info.dtype,
            rows,
            cols,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r` widened to f32.
    pub fn row_f32(&self, r: usize) -> Result<Vec<f32>, RowError> {
        self.rows_f32(&[r])
    }

    /// Rows `rows` one after another, widened to f32 (`rows.len() × cols` values). The file is
    /// checked against its load-time stamp before and after the reads.
    pub fn rows_f32(&self, rows: &[usize]) -> Result<Vec<f32>, RowError> {
        if let Some((at, &row)) = rows.iter().enumerate().find(|(_, &r)| r >= self.rows) {
            return Err(RowError::OutOfRange {
                row,
                at,
                rows: self.rows,
            });
        }
        self.check_unchanged()?;
        let row_bytes = self.cols * self.dtype.size();
        let mut raw = vec![0u8; rows.len() * row_bytes];
        for (&row, out) in rows.iter().zip(raw.chunks_exact_mut(row_bytes.max(1))) {
            let at = self.offset + (row * row_bytes) as u64;
            read_exact_at(&self.file, out, at).map_err(|e| self.io(e))?;
        }
        // A change during the reads may have mixed old and new bytes.
        self.check_unchanged()?;
        Ok(widen_f32(self.dtype, &raw))
    }

    fn check_unchanged(&self) -> Result<(), RowError> {
        match Stamp::of(&self.file) {
            Ok(now) if now == self.stamp => Ok(()),
            Ok(_) => Err(RowError::Changed {
                file: self.path.display().to_string(),
            }),
            Err(e) => Err(self.io(e)),
        }
    }

    fn io(&self, e: std::io::Error) -> RowError {
        RowError::Io {
            file: self.path.display().to_string(),
            msg: e.to_string(),
        }
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}
