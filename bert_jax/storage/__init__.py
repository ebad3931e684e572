"""Every user path (workdir, corpus, shards, tokenizer, HF folder) goes through here.

`paths.py` is the path layer (etils.epath: local, gs:// via gcsfs, s3:// via s3fs) and
the writes an object store allows; `preflight.py` checks, before step 0, that a run
can write its workdir and read its inputs, and says how to fix it when not.
`workdir.py` names every file a run keeps in its workdir and reads a run back
(its config, its checkpoints' params).
"""
