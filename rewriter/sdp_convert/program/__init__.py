"""The program model: what the transforms ask about a file, answered once and tested here.

The modules stand in layers, lowest first; a module imports from its own layer and the ones
below only (``LAYERS`` in tests/program/test_layering.py, the table in docs/how-it-works.md):

1. syntax, names and data: ``syntax``, ``positions``, ``names``, ``vocab``, ``facts``;
2. bindings: ``index`` (one walk of the file);
3. scopes: ``scopes`` (uses, callers and callees, argument to parameter, the training calls);
4. value flow and vocabularies: ``flow``, ``builders``, ``keras``, ``optimizers``, ``loaders``,
   ``writes``;
5. per-file facts: ``training``, ``models``, ``model_setup``, ``steps``, ``ranks``,
   ``rank_splits``, ``guards``, ``readback``, ``smp_saves``, ``deletions``, ``fetches``,
   ``launch``, ``permutations``, ``keras2``, ``keras_reads``;
6. the file in its project: ``project`` (what the other modules of the run say about it);
7. training data: ``datasets``, ``batch_iterators``, ``sample_lists``, ``tfshards``,
   ``sharding``;
8. the file's model: ``model`` (``FileModel``, named by every layer for types only);
9. the run: ``run`` (several modules, one program).

Every function here takes the file's program model, ``model.FileModel`` (built once per file by
the engine, or on its own with ``FileModel.from_source``), never a transform: nothing in this
package imports ``base``, a transform, the engine or anything above them
(tests/program/test_layering.py). Transforms import from here (and from ``base``), never from
each other, and pass ``self.fm``.
"""
