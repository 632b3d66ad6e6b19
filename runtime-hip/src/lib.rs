//! The MEMO backend for AMD GPUs (HIP).
//!
//! Not built yet: [`HipBackend::new`] returns an error saying so, and the type cannot be
//! constructed (it holds an uninhabited field), so no method can run.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use memo_plan_core::plan::{EventId, Op, Stream};
use memo_runtime::{Backend, BackendError, KernelArg, KernelContext, MemoryReport, Span};

/// The hip backend (not built yet).
pub struct HipBackend {
    never: std::convert::Infallible,
}

impl HipBackend {
    /// Opens device `ordinal`. Not built yet: always an error.
    pub fn new(ordinal: usize) -> Result<Self, BackendError> {
        Err(BackendError::Unavailable(format!("device {ordinal}: the hip backend (runtime-hip) is not built yet")))
    }
}

impl Backend for HipBackend {
    fn name(&self) -> String {
        match self.never {}
    }
    fn allocate(&mut self, _: u64, _: u64, _: u32) -> Result<(), BackendError> {
        match self.never {}
    }
    fn upload(&mut self, _: Span, _: &[u8]) -> Result<(), BackendError> {
        match self.never {}
    }
    fn download(&mut self, _: Span) -> Result<Vec<u8>, BackendError> {
        match self.never {}
    }
    fn launch(&mut self, _: usize, _: Stream, _: Op, _: &[KernelArg], _: &KernelContext) -> Result<(), BackendError> {
        match self.never {}
    }
    fn copy(&mut self, _: usize, _: Stream, _: Span, _: Span) -> Result<(), BackendError> {
        match self.never {}
    }
    fn record(&mut self, _: usize, _: Stream, _: EventId) -> Result<(), BackendError> {
        match self.never {}
    }
    fn wait(&mut self, _: usize, _: Stream, _: EventId) -> Result<(), BackendError> {
        match self.never {}
    }
    fn synchronize(&mut self) -> Result<(), BackendError> {
        match self.never {}
    }
    fn memory(&self) -> MemoryReport {
        match self.never {}
    }
}
