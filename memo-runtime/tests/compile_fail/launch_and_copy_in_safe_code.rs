// A backend's launches and copies are `unsafe`: safe code cannot enqueue work whose ordering
// against the other streams no checked plan vouches for.
use memo_plan_core::plan::{Op, Stream};
use memo_runtime::{Backend, KernelArg, KernelContext, Span};

fn launch(backend: &mut dyn Backend, args: &[KernelArg], context: &KernelContext) {
    backend.launch(0, Stream::Compute, Op::Add, args, context).unwrap();
}

fn copy(backend: &mut dyn Backend, src: Span, dst: Span) {
    backend.copy(1, Stream::DeviceToHost, src, dst).unwrap();
}

fn main() {
    let _ = (launch, copy);
}
