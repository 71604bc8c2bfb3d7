//! Token data: text tokenized once and cached, .bin files (bare and llm.c), splits, errors.

mod common;

use common::Scratch;
use helios_nn::{Error, Tokenizer, Tokens};

fn write_u16(path: &std::path::Path, ids: &[u16]) {
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn text_is_tokenized_once_and_cached_by_content() {
    let dir = Scratch::new("text");
    let tok = Tokenizer::gpt2().unwrap();
    let text = dir.join("story.txt");
    std::fs::write(&text, "Hello world. Hello world.").unwrap();
    let cache = dir.join("cache");

    let a = Tokens::open(&text, &tok, &cache).unwrap();
    assert_eq!(a.to_vec(), tok.encode("Hello world. Hello world.").unwrap());
    let cached = common::entries(&cache);
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert!(cached[0].starts_with("story.r50k_base.") && cached[0].ends_with(".bin"));
    assert_eq!(a.path(), cache.join(&cached[0]));

    // The second open reads the cache: it holds the tokens as a bare u16 file.
    let b = Tokens::open(&text, &tok, &cache).unwrap();
    assert_eq!(b.to_vec(), a.to_vec());
    assert_eq!(
        Tokens::open_bin(&cache.join(&cached[0])).unwrap().to_vec(),
        a.to_vec()
    );

    // Edited text: a new cache entry, never the stale one.
    std::fs::write(&text, "Goodbye world.").unwrap();
    let c = Tokens::open(&text, &tok, &cache).unwrap();
    assert_eq!(c.to_vec(), tok.encode("Goodbye world.").unwrap());
    assert_eq!(common::entries(&cache).len(), 2);
}

#[test]
fn bundled_corpus_tokenizes() {
    let dir = Scratch::new("corpus");
    let tok = Tokenizer::gpt2().unwrap();
    let corpus = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/shakespeare/shakespeare.txt"
    );
    // A slice keeps the debug-build test quick; the whole file is the same code path.
    let text: String = std::fs::read_to_string(corpus)
        .unwrap()
        .chars()
        .take(100_000)
        .collect();
    let path = dir.join("shakespeare.txt");
    std::fs::write(&path, &text).unwrap();
    let tokens = Tokens::open(&path, &tok, dir.path()).unwrap();
    assert!(
        tokens.len() > 20_000 && tokens.len() < 40_000,
        "{}",
        tokens.len()
    );
    assert_eq!(tok.decode(&tokens.to_vec()).unwrap(), text);
}

#[test]
fn bin_files_bare_and_llmc() {
    let dir = Scratch::new("bin");
    let ids: Vec<u16> = (0..1000).map(|i| (i * 37 % 50257) as u16).collect();
    let bare = dir.join("bare.bin");
    write_u16(&bare, &ids);
    let t = Tokens::open_bin(&bare).unwrap();
    assert_eq!(t.len(), 1000);
    assert_eq!(t.get(3), 111);
    assert_eq!(
        t.to_vec(),
        ids.iter().map(|&i| i as u32).collect::<Vec<_>>()
    );

    // llm.c: 256 i32 header (magic, version 1, count) then the tokens.
    let mut bytes = vec![0u8; 1024];
    bytes[0..4].copy_from_slice(&20240520i32.to_le_bytes());
    bytes[4..8].copy_from_slice(&1i32.to_le_bytes());
    bytes[8..12].copy_from_slice(&1000i32.to_le_bytes());
    bytes.extend(ids.iter().flat_map(|i| i.to_le_bytes()));
    let llmc = dir.join("llmc.bin");
    std::fs::write(&llmc, &bytes).unwrap();
    assert_eq!(Tokens::open_bin(&llmc).unwrap().to_vec(), t.to_vec());

    // A header that promises more tokens than the file has.
    bytes[8..12].copy_from_slice(&5000i32.to_le_bytes());
    std::fs::write(&llmc, &bytes).unwrap();
    let e = Tokens::open_bin(&llmc).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}

#[test]
fn data_errors_say_what_is_wrong() {
    let dir = Scratch::new("errors");
    let tok = Tokenizer::gpt2().unwrap();

    // Missing file.
    let e = Tokens::open(&dir.join("none.txt"), &tok, dir.path()).unwrap_err();
    assert!(matches!(e, Error::MissingFile { .. }), "{e}");
    // Empty text and empty .bin.
    std::fs::write(dir.join("empty.txt"), "").unwrap();
    let e = Tokens::open(&dir.join("empty.txt"), &tok, dir.path()).unwrap_err();
    assert!(matches!(e, Error::EmptyData { .. }), "{e}");
    std::fs::write(dir.join("empty.bin"), "").unwrap();
    let e = Tokens::open(&dir.join("empty.bin"), &tok, dir.path()).unwrap_err();
    assert!(matches!(e, Error::EmptyData { .. }), "{e}");
    // Odd byte count.
    std::fs::write(dir.join("odd.bin"), [1u8, 2, 3]).unwrap();
    let e = Tokens::open_bin(&dir.join("odd.bin")).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    // Token ids from a larger vocabulary.
    write_u16(&dir.join("big.bin"), &[5, 60000, 7]);
    let e = Tokens::open(&dir.join("big.bin"), &tok, dir.path()).unwrap_err();
    match &e {
        Error::TokenOutOfRange {
            position,
            id,
            vocab,
            ..
        } => assert_eq!((*position, *id, *vocab), (1, 60000, 50257)),
        _ => panic!("{e}"),
    }
    assert!(e.to_string().contains("vocabulary mismatch"), "{e}");
    // Not UTF-8 text.
    std::fs::write(dir.join("latin1.txt"), [0x63u8, 0x61, 0x66, 0xe9]).unwrap();
    let e = Tokens::open(&dir.join("latin1.txt"), &tok, dir.path()).unwrap_err();
    assert!(e.to_string().contains("not UTF-8"), "{e}");
    // A directory is unreadable as a file.
    let e = Tokens::open_bin(dir.path()).unwrap_err();
    assert!(matches!(e, Error::Io { .. } | Error::Corrupt { .. }), "{e}");
}

#[test]
fn split_takes_the_last_fraction_for_validation() {
    let ids: Vec<u32> = (0..1000).collect();
    let t = Tokens::from_ids(&ids, "mem").unwrap();
    let (train, val) = t.split(0.1).unwrap();
    assert_eq!((train.len(), val.len()), (900, 100));
    assert_eq!(train.get(899), 899);
    assert_eq!(val.get(0), 900);
    assert_eq!(val.to_vec(), (900..1000).collect::<Vec<_>>());
    let (all, none) = t.split(0.0).unwrap();
    assert_eq!((all.len(), none.len()), (1000, 0));
    // A tiny positive fraction still yields one validation token.
    assert_eq!(t.split(1e-9).unwrap().1.len(), 1);
    assert!(t.split(1.0).is_err());
    assert!(t.split(-0.1).is_err());
    assert!(Tokens::from_ids(&[1], "one").unwrap().split(0.5).is_err());
    assert!(matches!(
        Tokens::from_ids(&[], "none"),
        Err(Error::EmptyData { .. })
    ));
    assert!(Tokens::from_ids(&[70000], "wide").is_err());
    // Validation data is checked against a vocabulary too.
    let e = val.check_vocab(950).unwrap_err();
    assert!(
        matches!(e, Error::TokenOutOfRange { position: 950, .. }),
        "{e}"
    );
}
