#!/usr/bin/env python3
"""The token ids transformers' AutoTokenizer gives the perplexity text, first 2048, as
golden.py scores them: runtime/tests/data/ppl_ids_transformers.json.
usage: golden_ppl_ids.py CHECKPOINT_DIR TEXT_FILE OUT.json
"""
import json, sys
import transformers
from transformers import AutoTokenizer
ckpt, text_f, out_f = sys.argv[1:4]
ids = AutoTokenizer.from_pretrained(ckpt)(open(text_f).read()).input_ids[:2048]
json.dump({"made_by": f"transformers {transformers.__version__} AutoTokenizer on the imported checkpoint "
           f"({ckpt}), tokenizer(text).input_ids[:2048], as scripts/golden.py does", "ids": ids},
          open(out_f, "w"))
