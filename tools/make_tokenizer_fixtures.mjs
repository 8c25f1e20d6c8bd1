// Writes the tokenizer fixtures of tests/fixtures/tokenizers/ from three npm packages that
// carry real vocabularies and their own JavaScript encoders:
//
//   gpt-3-encoder 1.1.4         GPT-2's encoder.json and vocab.bpe
//   llama-tokenizer-js 1.2.2    Llama 2's 32000 pieces and merges
//   llama3-tokenizer-js 1.2.0   Llama 3's 128000 tokens, merges and special tokens
//
// Output: gpt2/vocab.json + gpt2/merges.txt (GPT-2's files as published), llama2/ and
// llama3/ vocab.txt (one token per line, the id is the line number) + merges.txt ("a b" per
// line, in priority order), and expected_node.json: the ids each package's encoder gives for
// the cases of CASES below, the reference the C++ tests compare against.
//
// Usage: node tools/make_tokenizer_fixtures.mjs [PACKAGES_DIR]
// PACKAGES_DIR holds the unpacked packages (PACKAGES_DIR/<name>/package/...); without it
// the script fetches them with `npm pack` into a temporary folder.
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import {createRequire} from 'node:module';
import os from 'node:os';
import path from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';

const PACKAGES = ['gpt-3-encoder@1.1.4', 'llama-tokenizer-js@1.2.2', 'llama3-tokenizer-js@1.2.0'];
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = path.join(root, 'tests', 'fixtures', 'tokenizers');

function fetchPackages() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tandem-tok-'));
  for (const spec of PACKAGES) {
    const name = spec.split('@')[0];
    const tgz = execFileSync('npm', ['pack', spec, '--silent'], {cwd: dir}).toString().trim();
    fs.mkdirSync(path.join(dir, name));
    execFileSync('tar', ['xzf', path.join(dir, tgz), '-C', path.join(dir, name)]);
  }
  return dir;
}

// The test cases. Each is a string, or {hex: "..."} for bytes that are not valid UTF-8 (the
// encoders take JavaScript strings, so such bytes reach them through TextDecoder, which
// replaces each maximal invalid subsequence by U+FFFD, as tandem does).
const CASES = [
  '',
  'Hello world',
  'Hello, world! How are you today?',
  ' leading space',
  'trailing spaces   ',
  'double  space and   triple',
  'tabs\tand\t\ttabs',
  'new\nline\n\nand\r\nCRLF\n',
  '\n\n\n',
  '   \n  \t \n',
  "it's we're they've I'm you'll he'd can't",
  "IT'S WE'RE THEY'VE I'M YOU'LL HE'D CAN'T",
  "'s 's's ''s",
  'digits 1 12 123 1234 12345 3.14159 1,000,000',
  'phone: +1 (555) 123-4567; year 2024',
  'punctuation!!! ??? ... --- ;;; (([[{{}}]]))',
  'email@example.com https://example.com/path?q=1&r=2#frag',
  'Ünïcödé çàfé naïve résumé Straße',
  'Ελληνικά Русский текст עברית العربية',
  '中文字符测试，日本語のテキスト、한국어 텍스트',
  'emoji 😀 😃 🎉 👍🏽 🇺🇸 🇫🇷',
  'ZWJ 👨‍👩‍👧‍👦 👩‍💻 🏳️‍🌈 🧑🏿‍🚀',
  'math ∑ ∫ √ ∞ ≈ ≠ ≤ ≥ → ← ↔',
  'mixed\tCamelCase snake_case kebab-case SCREAMING_CASE',
  'def f(x):\n    return x ** 2  # square\n',
  '    indented code\n\t\tdouble tab\n',
  'a',
  ' ',
  '  ',
  '\t',
  'zero\u200bwidth\u200cjoiner\u200d',
  'nbsp\u00a0here and\u2003em space',
  'The quick brown fox jumps over the lazy dog. ' +
      'THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.',
  {hex: '48656c6c6fff20776f726c64'},                 // "Hello\xff world"
  {hex: 'e282ac20e282202063616e27742062652066ff'},   // a cut € then \xff at the end
  {hex: 'c0af20eda08020f4908080'},                   // overlong, surrogate, past U+10FFFF
];

// Special tokens in text, per vocabulary (Llama 2's <s> is left out: the JavaScript encoder
// has no notion of special tokens in text).
const SPECIAL_CASES = {
  gpt2: ['<|endoftext|>', 'Hello<|endoftext|>world', 'a <|endoftext|> b<|endoftext|>'],
  llama3: [
    '<|begin_of_text|>Hello<|end_of_text|>',
    '<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>',
    'text <|reserved_special_token_5|> more',
  ],
};

function caseText(c) {
  return typeof c === 'string' ? c : new TextDecoder('utf-8').decode(Buffer.from(c.hex, 'hex'));
}

// The long case: every case above, one after the other.
function allCases() {
  return CASES.map(caseText).join('\n');
}

function record(c, ids) {
  return typeof c === 'string' ? {text: c, ids} : {hex: c.hex, ids};
}

// GPT-2: gpt-3-encoder sees no special tokens, so text is split at <|endoftext|> first (the
// tokenizer matches it before pre-tokenization) and each piece encoded on its own.
function gpt2Encode(enc, text) {
  const ids = [];
  const parts = text.split('<|endoftext|>');
  parts.forEach((part, i) => {
    if (i > 0) ids.push(50256);
    if (part.length > 0) ids.push(...enc.encode(part));
  });
  return ids;
}

// One case per line: readable diffs without a line per id.
function compactJson(expected) {
  const parts = Object.entries(expected).map(([key, value]) => {
    if (!Array.isArray(value)) return ` ${JSON.stringify(key)}: ${JSON.stringify(value)}`;
    const rows = value.map((v) => '  ' + JSON.stringify(v));
    return ` ${JSON.stringify(key)}: [\n${rows.join(',\n')}\n ]`;
  });
  return '{\n' + parts.join(',\n') + '\n}\n';
}

function writeLines(file, lines) {
  fs.writeFileSync(file, lines.join('\n') + '\n');
}

async function main() {
  const dir = process.argv[2] ? path.resolve(process.argv[2]) : fetchPackages();
  const pkg = (name) => path.join(dir, name, 'package');
  const require = createRequire(import.meta.url);
  const gpt2 = require(path.join(pkg('gpt-3-encoder'), 'Encoder.js'));
  const llama2 =
      (await import(pathToFileURL(path.join(pkg('llama-tokenizer-js'), 'llama-tokenizer.js'))))
          .default;
  const llama3 = (await import(pathToFileURL(
                      path.join(pkg('llama3-tokenizer-js'), 'bundle',
                                'llama3-tokenizer-with-baked-data.js'))))
                     .default;

  for (const d of ['gpt2', 'llama2', 'llama3']) fs.mkdirSync(path.join(out, d), {recursive: true});
  fs.copyFileSync(path.join(pkg('gpt-3-encoder'), 'encoder.json'),
                  path.join(out, 'gpt2', 'vocab.json'));
  fs.copyFileSync(path.join(pkg('gpt-3-encoder'), 'vocab.bpe'), path.join(out, 'gpt2', 'merges.txt'));

  // Llama 2: all 32000 pieces (ids 0-2 are <unk>, <s>, </s>; 3-258 the byte pieces).
  writeLines(path.join(out, 'llama2', 'vocab.txt'), llama2.vocabById);
  writeLines(path.join(out, 'llama2', 'merges.txt'), [...llama2.merges.keys()]);
  // Llama 3: the 128000 ordinary tokens; the 256 special ones (128000-128255) are named in
  // expected_node.json, since tests add them as added tokens.
  const specials = llama3.vocabById.slice(128000);
  writeLines(path.join(out, 'llama3', 'vocab.txt'), llama3.vocabById.slice(0, 128000));
  writeLines(path.join(out, 'llama3', 'merges.txt'), [...llama3.merges.keys()]);

  const expected = {
    note: 'ids from the packages\' own encoders (tools/make_tokenizer_fixtures.mjs)',
    gpt2: [],
    llama2: [],
    llama3: [],
    llama3_specials: specials,
  };
  const all = [...CASES, allCases()];
  for (const c of all) {
    const text = caseText(c);
    expected.gpt2.push(record(c, gpt2Encode(gpt2, text)));
    // Llama 2 as its Hugging Face tokenizer encodes without special tokens: a "▁" prepended
    // to non-empty text, no BOS.
    expected.llama2.push(record(c, llama2.encode(text, false, true)));
    expected.llama3.push(record(c, llama3.encode(text, {bos: false, eos: false})));
  }
  for (const t of SPECIAL_CASES.gpt2) expected.gpt2.push(record(t, gpt2Encode(gpt2, t)));
  for (const t of SPECIAL_CASES.llama3)
    expected.llama3.push(record(t, llama3.encode(t, {bos: false, eos: false})));
  fs.writeFileSync(path.join(out, 'expected_node.json'), compactJson(expected));
  console.log(`wrote ${out}: ${all.length} cases per vocabulary`);
}

await main();
