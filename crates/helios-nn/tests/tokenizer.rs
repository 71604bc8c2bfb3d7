//! Tokenizer: GPT-2's ids for known strings, round trips, a tokenizer.json, errors.

mod common;

use helios_nn::{Error, Tokenizer};

#[test]
fn gpt2_matches_known_ids() {
    let t = Tokenizer::gpt2().unwrap();
    assert_eq!(t.vocab_size(), 50257);
    assert_eq!(t.eot(), Some(50256));
    assert_eq!(t.id(), "r50k_base");
    // Ids from OpenAI's tiktoken / Hugging Face's GPT2TokenizerFast.
    assert_eq!(t.encode("Hello world").unwrap(), vec![15496, 995]);
    assert_eq!(t.encode("Hello, world!").unwrap(), vec![15496, 11, 995, 0]);
    assert_eq!(t.encode(" the").unwrap(), vec![262]);
    assert_eq!(t.encode("<|endoftext|>").unwrap(), vec![50256]);
    assert_eq!(t.decode(&[15496, 995]).unwrap(), "Hello world");
}

#[test]
fn gpt2_round_trips_text() {
    let t = Tokenizer::gpt2().unwrap();
    let text = "To be, or not to be, that is the question:\n\
                Whether 'tis nobler in the mind to suffer\n  \
                naïve café — 東京 🦀 1234567 <|endoftext|> tabs\there";
    let ids = t.encode(text).unwrap();
    assert!(ids.contains(&50256));
    assert_eq!(t.decode(&ids).unwrap(), text);
    // The bundled corpus's first lines round-trip too.
    let corpus = include_str!("../../../data/shakespeare/shakespeare.txt");
    let head = &corpus[..20_000];
    assert_eq!(t.decode(&t.encode(head).unwrap()).unwrap(), head);
}

#[test]
fn decode_is_lossy_on_cut_characters_and_strict_on_ids() {
    let t = Tokenizer::gpt2().unwrap();
    let ids = t.encode("🦀").unwrap();
    assert!(ids.len() > 1, "the crab takes several byte tokens");
    assert!(t.decode(&ids[..1]).unwrap().contains('\u{fffd}'));
    let e = t.decode(&[50257]).unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
}

/// A word-level tokenizer.json, the smallest the tokenizers crate reads.
const TOKENIZER_JSON: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": null,
  "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "!": 3},
            "unk_token": "[UNK]"}
}"#;

#[test]
fn tokenizer_json_is_read_with_the_tokenizers_crate() {
    let dir = common::Scratch::new("tok");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, TOKENIZER_JSON).unwrap();
    let t = Tokenizer::from_file(&path).unwrap();
    assert_eq!(t.vocab_size(), 4);
    assert!(t.id().starts_with("hf-"));
    assert_eq!(t.encode("hello world !").unwrap(), vec![1, 2, 3]);
    assert_eq!(t.encode("hello moon").unwrap(), vec![1, 0]);
    assert_eq!(t.decode(&[1, 2]).unwrap(), "hello world");
    assert!(t.decode(&[4]).is_err());
    // from_option picks GPT-2 without a path.
    assert_eq!(Tokenizer::from_option(None).unwrap().vocab_size(), 50257);
}

#[test]
fn tokenizer_file_errors() {
    let dir = common::Scratch::new("tok-err");
    let missing = dir.join("nope.json");
    assert!(matches!(
        Tokenizer::from_file(&missing),
        Err(Error::MissingFile { .. })
    ));
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"model\": 3}").unwrap();
    let e = Tokenizer::from_file(&bad).unwrap_err();
    assert!(matches!(e, Error::Tokenizer(_)), "{e}");
    assert!(e.to_string().contains("bad.json"), "{e}");
}
