"""Downloads and one-time preparation as data: the names ``order_downloads`` (through
``program.fetches``) acts on and the whole-program contract checks for; and the Keras callbacks
that write files (``wrap_keras_fit`` keeps them on rank 0; ``modules`` finds a project's
subclasses of them).

No libcst here: ``contract`` reads programs with ``ast`` and imports this module only.
"""

from __future__ import annotations

#: Calls that fetch into a cache or a dataset directory and find what is there already on the
#: next call: each machine's local rank 0 runs them first (``sdp.rank0_first()``), the other
#: ranks after it find the files. ``torchvision.datasets.`` classes need ``download=True``.
CACHED_DOWNLOADS = (
    "torch.hub.load",
    "torch.hub.load_state_dict_from_url",
    "tensorflow_datasets.load",
    "datasets.load_dataset",
    "torchvision.datasets.utils.download_and_extract_archive",
    # Word vectors: downloaded and unpacked into .vector_cache on construction.
    "torchtext.vocab.GloVe",
    "torchtext.vocab.FastText",
    "torchtext.vocab.CharNGram",
    "torchtext.vocab.Vectors",
)
#: Prefixes of calls that download (their arguments decide: ``download=``, ``weights=``,
#: ``pretrained=``).
CACHED_DOWNLOAD_PREFIXES = (
    "torchvision.datasets.", "torchvision.models.", "torchtext.datasets.",
    "torchtext.legacy.datasets.", "timm.create_model",
)
#: torchtext's dataset modules: the legacy classes download through their ``splits``/``iters``
#: classmethods (unless given ``path=``) and ``download``; their constructors only read the local
#: files they are given (``TranslationDataset(path=..., exts=..., fields=...)``). The functions
#: of torchtext >= 0.12 (``AG_NEWS(root=..., split=...)``) download.
TORCHTEXT_DATASETS = ("torchtext.datasets.", "torchtext.legacy.datasets.")
#: Legacy torchtext classmethods that download where no ``path=`` is given, and the one that
#: always does.
TORCHTEXT_DOWNLOADING_METHODS = ("splits", "iters")
#: Legacy torchtext dataset classes that read local files only (no URLs of their own).
TORCHTEXT_LOCAL_READERS = frozenset(
    {"TranslationDataset", "LanguageModelingDataset", "SequenceTaggingDataset"}
)
#: Arguments only legacy torchtext constructors take: the files to read and how to read them.
TORCHTEXT_LOCAL_ARGUMENTS = ("path", "fields", "text_field", "exts")

#: Calls that download into the path they are given every time they run, whatever is there.
FILE_DOWNLOADS = (
    "urllib.request.urlretrieve",
    "six.moves.urllib.request.urlretrieve",
    "gdown.download",
    "wget.download",
    # It skips a file whose checksum matches, but every rank finding none writes the same file.
    "torchvision.datasets.utils.download_url",
)

#: Calls that unpack an archive into a directory every time they run.
EXTRACTIONS = ("shutil.unpack_archive",)
#: Methods of an opened archive that unpack it (``zipfile.ZipFile``, ``tarfile.open``): all of it,
#: or one member (``for item in tar: tar.extract(item, dest)``).
EXTRACT_METHODS = ("extractall", "extract")
#: What opens an archive (the receiver of an ``EXTRACT_METHODS`` call).
ARCHIVES = ("zipfile.ZipFile", "tarfile.open", "tarfile.TarFile")

#: Network reads into memory: a file only where the script writes what they return.
RESPONSES = (
    "requests.get",
    "requests.request",
    "urllib.request.urlopen",
    "six.moves.urllib.request.urlopen",
)

#: Readers that take a URL as well as a path and read it into memory: each rank downloads it.
URL_READERS = (
    "pandas.read_csv",
    "pandas.read_table",
    "pandas.read_json",
    "pandas.read_excel",
    "pandas.read_parquet",
)
#: Readers that, given a URL, first download it into the working directory
#: (``./<host>/<path>``, numpy's ``DataSource``) on every call: every rank writes that file.
URL_CACHING_READERS = ("numpy.loadtxt", "numpy.genfromtxt")
#: How a URL starts.
URL_SCHEMES = ("http://", "https://", "ftp://")


#: Keras callbacks that write files or talk to the outside: rank 0 only (``wrap_keras_fit``); a
#: project's subclass of one (``CustomModelCheckpoint(ModelCheckpoint)``) writes as well.
WRITING_KERAS_CALLBACKS = frozenset(
    {"ModelCheckpoint", "TensorBoard", "CSVLogger", "BackupAndRestore", "OrbaxCheckpoint",
     "RemoteMonitor"}
)

#: How a Horovod/SMDDP migration's note on a learning rate not scaled by ``size()`` begins:
#: the whole-program contract counts it for no part (the gradients are averaged all the same).
UNSCALED_LR_NOTE = "the learning rate is not scaled by size()"

#: How a migration's note on a name the runtime lacks says that only one branch of a conditional
#: expression reads it (``op=hvd.Adasum if args.use_adasum else hvd.Average``): whether a run
#: reaches it depends on its flags, so the contract's part it speaks for is "unknown".
ONE_BRANCH_NOTE = "evaluated only when "

#: Openings of the notes removing ``nn.DataParallel`` leaves (``program.models``): checkpoint
#: formats and GPU-count products, which say nothing of whether the gradients are averaged.
DATA_PARALLEL_CHECKPOINTS = "nn.DataParallel's "
GROWN_FOR_DATA_PARALLEL = ": grown by the GPU count for nn.DataParallel"
