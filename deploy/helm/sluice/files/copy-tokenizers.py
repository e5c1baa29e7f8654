# The router's init container: copy what the router reads of each model
# version's checkpoint (sluice.router.models, sluice.tokenization.tokenizer)
# from the model volume into an emptyDir, so the router container never
# mounts the weights. Arguments: pairs of <checkpoint dir> <target dir>.
import pathlib
import shutil
import sys
FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "tokenizer.model", "chat_template.jinja")
pairs = sys.argv[1:]
if len(pairs) % 2:
    sys.exit(f"copy-tokenizers: expected <source> <target> pairs, got {pairs}")
for source, target in zip(pairs[0::2], pairs[1::2]):
    source, target = pathlib.Path(source), pathlib.Path(target)
    present = [name for name in FILES if (source / name).is_file()]
    for required in ("tokenizer.json", "config.json"):
        if required not in present:
            sys.exit(f"copy-tokenizers: {source} has no {required}; the router cannot serve this version")
    target.mkdir(parents=True, exist_ok=True)
    for name in present:
        shutil.copyfile(source / name, target / name)
    print(f"{source} -> {target}: {', '.join(present)}", flush=True)
