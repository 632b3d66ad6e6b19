use super::*;
use memo_runtime::BackendError;

#[test]
fn version_codes_decode_in_both_schemes() {
    let v = |major, minor, patch| Some(Version { major, minor, patch });
    assert_eq!(Version::from_code(22703), v(2, 27, 3));
    assert_eq!(Version::from_code(21400), v(2, 14, 0));
    assert_eq!(Version::from_code(23007), v(2, 30, 7));
    assert_eq!(Version::from_code(20906), v(2, 9, 6));
    assert_eq!(Version::from_code(30000), v(3, 0, 0));
    // Up to 2.8: major * 1000 + minor * 100 + patch.
    assert_eq!(Version::from_code(2804), v(2, 8, 4));
    assert_eq!(Version::from_code(2406), v(2, 4, 6));
    for code in [0, -1, 999, 2900, 5000, 20000, 20899] {
        assert_eq!(Version::from_code(code), None, "{code}");
    }
    for code in [2804, 20906, 21400, 22703, 23007, 30000] {
        let version = Version::from_code(code).expect("decodes");
        assert_eq!(version.code(), code as u32, "{version}");
    }
    assert_eq!(Version::from_code(22703).map(|v| v.to_string()), Some("2.27.3".into()));
    assert!(Version::from_code(21319).expect("2.13.19") < MIN_VERSION);
}

#[test]
fn several_ranks_per_gpu_need_2_30_and_a_non_zero_switch() {
    let v2_30 = Version { major: 2, minor: 30, patch: 0 };
    let v2_29 = Version { major: 2, minor: 29, patch: 7 };
    assert!(v2_30.supports_multi_rank_per_gpu(Some("1")));
    assert!(v2_30.supports_multi_rank_per_gpu(Some(" 2 ")));
    assert!(Version { major: 3, minor: 0, patch: 0 }.supports_multi_rank_per_gpu(Some("1")));
    assert!(!v2_30.supports_multi_rank_per_gpu(Some("0")));
    assert!(!v2_30.supports_multi_rank_per_gpu(Some("yes")));
    assert!(!v2_30.supports_multi_rank_per_gpu(None));
    assert!(!v2_29.supports_multi_rank_per_gpu(Some("1")));
}

#[test]
fn data_types_and_operations_have_the_header_values() {
    assert_eq!([DataType::U8, DataType::U32, DataType::F32, DataType::Bf16].map(DataType::raw), [1, 3, 7, 9]);
    assert_eq!([DataType::U8, DataType::U32, DataType::F32, DataType::Bf16].map(DataType::bytes), [1, 4, 4, 2]);
    assert_eq!([ReduceOp::Sum, ReduceOp::Max].map(ReduceOp::raw), [0, 2]);
}

#[test]
fn a_unique_id_is_exactly_128_bytes() {
    let bytes: Vec<u8> = (0..128).collect();
    assert_eq!(UniqueId::from_bytes(&bytes).map(|id| id.0.to_vec()), Ok(bytes.clone()));
    let short = UniqueId::from_bytes(&bytes[..127]);
    assert_eq!(short, Err(NcclError::Invalid("a unique id is 128 bytes, not 127".into())));
    assert_eq!(format!("{:?}", UniqueId::from_bytes(&bytes).expect("valid")), "UniqueId(0001020304050607...)");
}

#[test]
fn missing_pieces_are_unavailable_and_failures_are_not() {
    let missing =
        NcclError::LibraryNotFound { flavour: NCCL, tried: vec!["libnccl.so.2 by the system search (gone)".into()] };
    let text = missing.to_string();
    assert!(
        text.starts_with("NCCL cannot be loaded; tried libnccl.so.2 by the system search (gone). To fix: "),
        "{text}"
    );
    assert!(text.ends_with("or set MEMO_NCCL_LIBRARY to the library file"), "{text}");
    assert!(matches!(BackendError::from(missing), BackendError::Unavailable(_)));
    let old = NcclError::TooOld { library: "x.so".into(), code: 21212, version: Version::from_code(21212) };
    assert_eq!(
        old.to_string(),
        "x.so is version 2.12.12 (code 21212); 2.14.0 or newer is needed (the non-blocking communicator behind the \
         join timeout); install a newer one"
    );
    assert!(old.is_unavailable());
    let failed = NcclError::Call {
        call: "ncclAllReduce",
        code: 4,
        name: "ncclInvalidArgument",
        message: "invalid argument".into(),
        last: Some("bad count".into()),
    };
    assert_eq!(
        BackendError::from(failed),
        BackendError::Other(
            "collectives: ncclAllReduce failed: ncclInvalidArgument (4): invalid argument; last error: bad count"
                .into()
        )
    );
}
