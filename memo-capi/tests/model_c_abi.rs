//! Model descriptions through the C ABI: a Hugging Face `config.json` read as `memo plan` reads
//! it, its refusals with the field named, and the model a plan file was made for.

use std::ffi::CStr;
use std::mem::MaybeUninit;

use memo_capi::model::{memo_model_from_hf_config, memo_plan_model, MemoModel};
use memo_capi::plan_file::{memo_plan_free, memo_plan_load, MemoPlan};
use memo_capi::status::memo_last_error;
use memo_capi::MemoStatus;
use memo_plan_core::model::{Hardware, Interconnect, ModelConfig, Parallelism};
use memo_plan_core::plan::Strategy;
use memo_plan_core::planner::{plan, PlanRequest};

const LLAMA_8B: &str = include_str!("../../examples/models/hf/llama3.1-8b/config.json");
const QWEN_7B: &str = include_str!("../../examples/models/hf/qwen2.5-7b/config.json");

fn last_error() -> String {
    // Safety: never NULL; copied at once.
    unsafe { CStr::from_ptr(memo_last_error()) }.to_string_lossy().into_owned()
}

fn name(text: *const std::ffi::c_char) -> String {
    // Safety: the ABI's static names are never NULL and never freed.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

fn from_config(json: &str) -> Result<MemoModel, MemoStatus> {
    let mut out = MaybeUninit::<MemoModel>::uninit();
    // Safety: the text and the out-pointer are valid.
    let status = unsafe { memo_model_from_hf_config(json.as_ptr(), json.len(), 8192, 1, out.as_mut_ptr()) };
    // Safety: written on success.
    (status == MemoStatus::Ok).then(|| unsafe { out.assume_init() }).ok_or(status)
}

#[test]
fn a_config_gives_the_published_model() {
    let llama = from_config(LLAMA_8B).unwrap();
    assert_eq!(llama.parameter_count, 8_030_261_248);
    assert_eq!((llama.layers, llama.hidden, llama.heads, llama.kv_heads, llama.ffn_hidden), (32, 4096, 32, 8, 14336));
    assert_eq!((llama.vocab, llama.seq_len, llama.micro_batch), (128_256, 8192, 1));
    assert_eq!(
        (name(llama.ffn), name(llama.norm), name(llama.biases)),
        ("swiglu".into(), "rmsnorm".into(), "none".into())
    );
    assert_eq!((llama.tied_embeddings, llama.rope_scaling, llama.rope_theta), (0, 1, 500_000.0));
    let qwen = from_config(QWEN_7B).unwrap();
    assert_eq!(qwen.parameter_count, 7_615_616_512);
    assert_eq!((name(qwen.biases), qwen.norm_eps), ("qkv".into(), 1e-6));
}

#[test]
fn a_config_the_planner_cannot_describe_is_refused_naming_the_field() {
    let moe = LLAMA_8B.replacen('{', "{\n  \"num_local_experts\": 8,", 1);
    assert_eq!(from_config(&moe), Err(MemoStatus::InvalidArgument));
    let error = last_error();
    assert!(error.starts_with("memo_model_from_hf_config: ") && error.contains("num_local_experts"), "{error}");
    assert_eq!(from_config("{ not json"), Err(MemoStatus::InvalidArgument));
    assert!(last_error().contains("line 1"), "{}", last_error());
    let mut out = MaybeUninit::<MemoModel>::uninit();
    // Safety: a NULL out-pointer is refused before anything is read.
    let status = unsafe { memo_model_from_hf_config(LLAMA_8B.as_ptr(), LLAMA_8B.len(), 1024, 1, std::ptr::null_mut()) };
    assert_eq!(status, MemoStatus::NullPointer);
    // Safety: bytes that are not UTF-8, valid pointers.
    let status = unsafe { memo_model_from_hf_config([0xFFu8, 0xFE].as_ptr(), 2, 1024, 1, out.as_mut_ptr()) };
    assert_eq!(status, MemoStatus::InvalidArgument);
}

#[test]
fn a_plan_file_names_its_model() {
    let mut model = ModelConfig::preset("qwen2.5-7b", 4096, 1).unwrap();
    model.layers = 3;
    let mut request =
        PlanRequest::new(model.clone(), Parallelism::new(4, 1), Hardware::preset("h100x8").unwrap(), Strategy::Memo);
    request.interconnect = Interconnect::for_hardware(&request.hardware);
    let bytes = plan(&request).unwrap().plan.encode();
    let mut handle: *mut MemoPlan = std::ptr::null_mut();
    // Safety: the bytes and the out-pointer are valid.
    assert_eq!(unsafe { memo_plan_load(bytes.as_ptr(), bytes.len(), &mut handle) }, MemoStatus::Ok);
    let mut out = MaybeUninit::<MemoModel>::uninit();
    // Safety: a loaded plan and a valid out-pointer.
    assert_eq!(unsafe { memo_plan_model(handle, out.as_mut_ptr()) }, MemoStatus::Ok);
    // Safety: written on success.
    let described = unsafe { out.assume_init() };
    assert_eq!(described.parameter_count, model.parameter_count().unwrap());
    assert_eq!((described.layers, described.kv_heads, described.seq_len), (3, 4, 4096));
    assert_eq!(name(described.ffn), "swiglu");
    assert_eq!(memo_plan_free(handle), MemoStatus::Ok);
    // Safety: a freed handle is refused, not read.
    assert_eq!(unsafe { memo_plan_model(handle, out.as_mut_ptr()) }, MemoStatus::BadHandle);
}
