"""Dataset loaders on tiny files in each on-disk format, ImageData batches, and one image run."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image

from client.datasets import load_dataset
from client.images import ImageData, image_transforms
from client.runtime import build_runtime
from client.worker import EncodedData
from common.methods.checks import validate
from common.run.config import RunConfig
from common.run.partition import task_ranges
from engine.simulation import run_inprocess

CPU = torch.device("cpu")


def write_image(path: Path, seed: int, size: tuple[int, int] = (8, 8)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def config(tmp_path: Path, dataset: str, **changes) -> RunConfig:
    extra = {"image_size": 16, **changes.pop("extra", {})}
    return RunConfig(**{"dataset": dataset, "data_dir": str(tmp_path), "num_tasks": 1, "extra": extra, **changes})


def image_folder(root: Path, classes: list[str], per_class: int) -> None:
    for c, name in enumerate(classes):
        for k in range(per_class):
            write_image(root / name / f"img{k}.jpg", seed=100 * c + k)


def classes_of(paths: list[str]) -> list[str]:
    return [Path(p).parent.name for p in paths]


# --------------------------------------------------------------------------- CIFAR-100


def write_cifar(folder: Path, split: str, labels: list[int]) -> np.ndarray:
    folder.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(len(labels)).integers(0, 256, (len(labels), 3072), dtype=np.uint8)
    records = np.concatenate([np.zeros((len(labels), 1), np.uint8), np.array(labels, np.uint8)[:, None], pixels], 1)
    records.tofile(folder / f"{split}.bin")
    return pixels


def test_cifar100_binary_records(tmp_path):
    folder = tmp_path / "cifar100" / "cifar-100-binary"
    pixels = write_cifar(folder, "train", [2, 0, 1, 0, 2, 1])
    write_cifar(folder, "test", [1, 0, 2])
    (folder / "fine_label_names.txt").write_text("\n".join(f"name{c}" for c in range(100)) + "\n")
    splits = load_dataset(config(tmp_path, "cifar100", num_classes=3))
    assert splits.kind == "image" and splits.class_names == ["name0", "name1", "name2"]
    assert splits.train_y.tolist() == [2, 0, 1, 0, 2, 1] and splits.test_y.tolist() == [1, 0, 2]
    first = splits.train_x[0]  # (32, 32, 3): the red plane comes first in the record
    assert first.shape == (32, 32, 3) and first.dtype == np.uint8
    assert np.array_equal(first[..., 0].ravel(), pixels[0, :1024])
    assert np.array_equal(first[..., 2].ravel(), pixels[0, 2048:])


def test_cifar100_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cifar-100-binary.*LORM_DATA_DIR"):
        load_dataset(config(tmp_path, "cifar100"))
    folder = tmp_path / "cifar100" / "cifar-100-binary"
    write_cifar(folder, "train", [0, 1])
    write_cifar(folder, "test", [0, 150])
    with pytest.raises(ValueError, match=r"test\.bin: unknown fine labels \[150\]"):
        load_dataset(config(tmp_path, "cifar100", num_classes=2))
    (folder / "test.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="3074-byte records"):
        load_dataset(config(tmp_path, "cifar100", num_classes=2))


# --------------------------------------------------------------------------- folder per class


@pytest.mark.parametrize("dataset, subdir", [("imagenet-r", ""), ("imagenet-a", ""), ("eurosat", "2750")])
def test_folder_per_class_holdout_is_fixed_and_disjoint(tmp_path, dataset, subdir):
    names = ["n02", "n01", "n03"] if dataset != "eurosat" else ["River", "Forest", "Highway"]
    image_folder(tmp_path / dataset / subdir, names, per_class=5)
    splits = load_dataset(config(tmp_path, dataset, seed=1))
    again = load_dataset(config(tmp_path, dataset, seed=2))  # the split ignores the run seed
    assert splits.class_names == sorted(names)
    assert splits.train_x == again.train_x and splits.test_x == again.test_x
    assert not set(splits.train_x) & set(splits.test_x)
    assert len(splits.train_x) == 3 * 4 and len(splits.test_x) == 3 * 1  # 80/20 of 5 per class
    for x, y in ((splits.train_x, splits.train_y), (splits.test_x, splits.test_y)):
        assert classes_of(x) == [splits.class_names[c] for c in y]


def test_empty_class_is_named(tmp_path):
    image_folder(tmp_path / "imagenet-r", ["n01", "n02"], per_class=3)
    (tmp_path / "imagenet-r" / "n03").mkdir()
    with pytest.raises(ValueError, match=r"without training samples: \['n03'\]"):
        load_dataset(config(tmp_path, "imagenet-r"))


# --------------------------------------------------------------------------- Cars-196, CUB-200


def write_annos(path: Path, rows: list[tuple[int, str]]) -> None:
    table = np.zeros(len(rows), dtype=[("bbox_x1", "O"), ("class", "O"), ("fname", "O")])
    for i, (label, fname) in enumerate(rows):
        table[i] = (0, label, fname)
    scipy.io.savemat(path, {"annotations": table})


def test_cars196_devkit(tmp_path):
    root = tmp_path / "cars196"
    (root / "devkit").mkdir(parents=True)
    scipy.io.savemat(
        root / "devkit" / "cars_meta.mat", {"class_names": np.array(["A 2012", "B 2009", "C 2007"], dtype=object)}
    )
    write_annos(root / "devkit" / "cars_train_annos.mat", [(3, "00001.jpg"), (1, "00002.jpg"), (2, "00003.jpg")])
    write_annos(root / "devkit" / "cars_test_annos_withlabels.mat", [(2, "00001.jpg"), (3, "00002.jpg")])
    for split in ("train", "test"):
        for k in range(1, 4):
            write_image(root / f"cars_{split}" / f"{k:05d}.jpg", seed=k)
    splits = load_dataset(config(tmp_path, "cars196"))
    assert splits.class_names == ["A 2012", "B 2009", "C 2007"]
    assert splits.train_y.tolist() == [2, 0, 1] and splits.test_y.tolist() == [1, 2]
    assert splits.train_x[0] == str(root / "cars_train" / "00001.jpg")

    write_annos(root / "devkit" / "cars_test_annos_withlabels.mat", [(4, "00001.jpg")])
    with pytest.raises(ValueError, match=r"cars_test_annos_withlabels\.mat.*unknown labels \[4\]"):
        load_dataset(config(tmp_path, "cars196"))


def test_cub200_official_split(tmp_path):
    folder = tmp_path / "cub200" / "CUB_200_2011"
    folder.mkdir(parents=True)
    (folder / "classes.txt").write_text("1 001.Black_footed_Albatross\n2 002.Laysan_Albatross\n")
    images = {
        1: "001.Black_footed_Albatross/a.jpg",
        2: "002.Laysan_Albatross/b.jpg",
        3: "001.Black_footed_Albatross/c.jpg",
        4: "002.Laysan_Albatross/d.jpg",
    }
    (folder / "images.txt").write_text("".join(f"{i} {p}\n" for i, p in images.items()))
    (folder / "image_class_labels.txt").write_text("1 1\n2 2\n3 1\n4 2\n")
    (folder / "train_test_split.txt").write_text("1 1\n2 1\n3 0\n4 0\n")
    for i, p in images.items():
        write_image(folder / "images" / p, seed=i)
    splits = load_dataset(config(tmp_path, "cub200"))
    assert splits.class_names == ["Black_footed_Albatross", "Laysan_Albatross"]
    assert splits.train_y.tolist() == [0, 1] and splits.test_y.tolist() == [0, 1]
    assert [Path(p).name for p in splits.test_x] == ["c.jpg", "d.jpg"]

    (folder / "image_class_labels.txt").write_text("1 1\n2 2\n3 1\n4 7\n")
    with pytest.raises(ValueError, match=r"image_class_labels\.txt.*unknown labels \['7'\]"):
        load_dataset(config(tmp_path, "cub200"))


# --------------------------------------------------------------------------- bring your own data


def test_imagefolder_explicit_class_order_and_errors(tmp_path):
    image_folder(tmp_path / "mine" / "train", ["cat", "dog"], per_class=2)
    image_folder(tmp_path / "mine" / "test", ["dog"], per_class=1)
    splits = load_dataset(config(tmp_path, "imagefolder", extra={"root": "mine", "classes": ["dog", "cat"]}))
    assert splits.class_names == ["dog", "cat"]
    assert [splits.class_names[c] for c in splits.train_y] == classes_of(splits.train_x)
    assert splits.test_y.tolist() == [0]

    with pytest.raises(ValueError, match=r"without training samples: \['bird'\]"):
        load_dataset(config(tmp_path, "imagefolder", extra={"root": "mine", "classes": ["dog", "cat", "bird"]}))
    image_folder(tmp_path / "mine" / "test", ["fox"], per_class=1)
    with pytest.raises(ValueError, match=r"test \(class folders\): unknown labels \['fox'\]"):
        load_dataset(config(tmp_path, "imagefolder", extra={"root": "mine"}))
    with pytest.raises(FileNotFoundError, match=r"nowhere[/\\]train"):
        load_dataset(config(tmp_path, "imagefolder", extra={"root": str(tmp_path / "nowhere")}))


def test_textfile_csv_and_jsonl(tmp_path):
    (tmp_path / "train.csv").write_text('text,label\n"hello, there",greet\nbye now,leave\nhi,greet\n')
    (tmp_path / "test.jsonl").write_text(json.dumps({"text": "ciao", "label": "leave"}) + "\n\n")
    splits = load_dataset(config(tmp_path, "textfile", extra={"train_file": "train.csv", "test_file": "test.jsonl"}))
    assert splits.kind == "text" and splits.class_names == ["greet", "leave"]  # order of first appearance
    assert splits.train_x == ["hello, there", "bye now", "hi"] and splits.train_y.tolist() == [0, 1, 0]
    assert splits.test_x == ["ciao"] and splits.test_y.tolist() == [1]

    extra = {"train_file": "train.csv", "test_file": "test.jsonl", "classes": ["leave", "greet"]}
    assert load_dataset(config(tmp_path, "textfile", extra=extra)).train_y.tolist() == [1, 0, 1]
    (tmp_path / "test.jsonl").write_text(json.dumps({"text": "?", "label": "ask"}) + "\n")
    with pytest.raises(ValueError, match=r"test\.jsonl: unknown labels \['ask'\]"):
        load_dataset(config(tmp_path, "textfile", extra=extra))


# --------------------------------------------------------------------------- ImageData


def test_every_dataset_transform_gives_the_configured_size():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (10, 14, 3), dtype=np.uint8))
    for name in ("cifar100", "imagenet-r", "imagenet-a", "cub200", "cars196", "eurosat", "imagefolder"):
        t = image_transforms(name, 16)
        for transform in (t.train, t.test):
            out = transform(image)
            assert out.shape == (3, 16, 16) and out.dtype == torch.float32, name
    assert image_transforms("eurosat", 16).test(image).min() >= 0.0  # no normalisation
    assert image_transforms("cifar100", 16).test(image).min() < 0.0  # Normalize(0.5, 0.5)


def test_image_data_batches_and_reproducible_augmentation(tmp_path):
    image_folder(tmp_path, ["a", "b"], per_class=3)
    paths = sorted(str(p) for p in tmp_path.rglob("*.jpg"))
    arrays = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
    t = image_transforms("imagenet-r", 16)
    idx = torch.tensor([4, 0, 2])

    def augmented(data: ImageData, seed: int) -> torch.Tensor:
        return data.batch(idx, CPU, train=True, generator=torch.Generator().manual_seed(seed))[0]["pixel_values"]

    for samples in (paths, arrays):
        data = ImageData(samples, np.array([0, 0, 0, 1, 1, 1]), t.train, t.test)
        inputs, labels = data.batch(idx, CPU)
        assert inputs["pixel_values"].shape == (3, 3, 16, 16) and inputs["pixel_values"].dtype == torch.float32
        assert labels.tolist() == [1, 0, 0] and len(data) == 6
        assert torch.equal(inputs["pixel_values"], data.batch(idx, CPU)[0]["pixel_values"])
        state = torch.get_rng_state()
        assert torch.equal(augmented(data, 7), augmented(data, 7))
        assert not torch.equal(augmented(data, 7), augmented(data, 8))
        assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone


def tiny_vit_run(tmp_path: Path, classes: list[str], per_class: int, **changes) -> RunConfig:
    """A small run of ``tiny-vit`` on an image folder of ``classes`` (``per_class`` training images, 2 test)."""
    image_folder(tmp_path / "mine" / "train", classes, per_class=per_class)
    image_folder(tmp_path / "mine" / "test", classes, per_class=2)
    return config(
        tmp_path,
        "imagefolder",
        **{
            "backbone": "tiny-vit",
            "num_clients": 2,
            "beta": 1.0,
            "min_client_samples": 2,
            "rounds_per_task": 1,
            "local_epochs": 1,
            "batch_size": 4,
            "extra": {"root": "mine"},
            **changes,
        },
    )


def test_images_train_end_to_end(tmp_path):
    result = run_inprocess(tiny_vit_run(tmp_path, ["a", "b", "c"], per_class=6))
    assert len(result.matrix.accuracy()) == 1 and np.isfinite(result.history[0]["loss"])


def test_runtime_rejects_a_backbone_of_the_other_modality(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\nhi,a\nbye,b\n")
    cfg = config(tmp_path, "textfile", backbone="tiny-vit", extra={"train_file": "train.csv", "test_file": "train.csv"})
    with pytest.raises(ValueError, match="gives text samples but backbone ViTBackbone takes images"):
        build_runtime(cfg)


def test_clinc150_downloads_missing_files_and_verifies_them(tmp_path, monkeypatch):
    """Without the files on disk the loader fetches them from the pinned public source."""
    import io
    import urllib.request

    from client import text_datasets as ds

    shared = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "clinc150"
    if not (shared / "data_full.json").exists():
        pytest.skip(f"no local CLINC150 copy under {shared} to serve")
    served = []

    def fake_urlopen(url, timeout):
        assert url.startswith(ds.CLINC150_SOURCE)
        name = url.rsplit("/", 1)[1]
        served.append(name)
        return io.BytesIO((shared / name).read_bytes())

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("LORM_OFFLINE", raising=False)
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    splits = ds.clinc150(RunConfig(dataset="clinc150", data_dir=str(tmp_path)))
    assert served == ["data_full.json"] and splits.num_classes == 150  # the default order needs no domains.json
    ds.clinc150(RunConfig(dataset="clinc150", data_dir=str(tmp_path), class_order="domains"))
    assert served == ["data_full.json", "domains.json"]
    assert (tmp_path / "clinc150" / "data_full.json").exists()

    (tmp_path / "clinc150" / "data_full.json").unlink()
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"tampered"))
    with pytest.raises(FileNotFoundError, match="sha256"):
        ds.clinc150(RunConfig(dataset="clinc150", data_dir=str(tmp_path)))
    monkeypatch.setenv("LORM_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="offline"):
        ds.clinc150(RunConfig(dataset="clinc150", data_dir=str(tmp_path)))


SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "datasets"
needs_clinc150 = pytest.mark.skipif(
    not (SHARED_DATA / "clinc150" / "data_full.json").exists(), reason=f"CLINC150 not found under {SHARED_DATA}"
)


@needs_clinc150
def test_clinc150_default_order_is_alphabetical_as_the_papers_code():
    """Class ids and task contents follow ``sorted(set(intent names))``, so tasks mix domains."""
    data = json.loads((SHARED_DATA / "clinc150" / "data_full.json").read_text())
    cfg = RunConfig(dataset="clinc150", data_dir=str(SHARED_DATA), num_tasks=5)
    assert cfg.class_order == "alphabetical" and json.loads(cfg.to_json())["class_order"] == "alphabetical"
    splits = load_dataset(cfg)
    names = sorted({intent for _, intent in data["train"]})
    assert len(names) == 150 and splits.class_names == names
    assert [names[y] for y in splits.train_y] == [intent for _, intent in data["train"]]
    assert [names[y] for y in splits.test_y] == [intent for _, intent in data["test"]]
    tasks = task_ranges(150, 5, [])
    assert [splits.class_names[lo:hi] for lo, hi in tasks] == [names[30 * k : 30 * k + 30] for k in range(5)]
    domains = json.loads((SHARED_DATA / "clinc150" / "domains.json").read_text())
    domain_of = {intent: d for d, intents in domains.items() for intent in intents}
    assert len({domain_of[n] for n in names[:30]}) >= 5  # the first task spans many domains


@needs_clinc150
@pytest.mark.parametrize("order", ["alphabetical", "domains"])
def test_a_clinc150_client_describes_its_intents_in_head_order(order):
    """The names the client describes (and the export's card then holds) are its head's rows: a sample of
    intent ``name`` is labelled ``classes.index(name)``, in the paper's order or by domain."""
    data = json.loads((SHARED_DATA / "clinc150" / "data_full.json").read_text())
    cfg = RunConfig(
        dataset="clinc150", data_dir=str(SHARED_DATA), class_order=order, num_tasks=5, train_per_class=1, threads=1
    )
    runtime = build_runtime(cfg)
    classes = runtime.spec.classes
    assert classes is not None and len(classes) == runtime.spec.num_classes == 150
    assert list(classes) == (sorted(classes) if order == "alphabetical" else load_dataset(cfg).class_names)
    assert runtime.spec.max_length == 32  # the configuration's
    first = {}  # each intent's first training sentence, as train_per_class=1 keeps it
    for text, intent in data["train"]:
        first.setdefault(intent, text)
    assert isinstance(runtime.train, EncodedData)
    labels = [classes[y] for y in runtime.train.labels.tolist()]
    assert sorted(labels) == sorted(classes)  # one sentence each
    encoded = runtime.model.backbone.encode([first[name] for name in labels])["input_ids"]
    assert torch.equal(encoded, runtime.train.inputs["input_ids"])  # row i's sentence is of intent labels[i]


@needs_clinc150
def test_clinc150_val_split_joins_the_training_set_on_request(tmp_path):
    data = json.loads((SHARED_DATA / "clinc150" / "data_full.json").read_text())
    base = RunConfig(dataset="clinc150", data_dir=str(SHARED_DATA), num_tasks=5)
    plain = load_dataset(base)
    both = load_dataset(RunConfig(**{**json.loads(base.to_json()), "settings": {"data": {"train_val": True}}}))
    assert len(plain.train_x) == 15000 and len(both.train_x) == 15000 + len(data["val"]) == 18000
    assert both.train_x[:15000] == plain.train_x and both.train_x[15000:] == [t for t, _ in data["val"]]
    assert np.bincount(both.train_y, minlength=150).tolist() == [120] * 150
    assert both.test_x == plain.test_x and both.test_y.tolist() == plain.test_y.tolist()
    (tmp_path / "train.csv").write_text("text,label\nhi,a\nbye,b\n")
    files = {"data": {"train_file": "train.csv", "test_file": "train.csv", "train_val": True}}
    with pytest.raises(ValueError, match="data.train_val is CLINC150's"):
        load_dataset(config(tmp_path, "textfile", settings=files))


@needs_clinc150
def test_clinc150_domain_order_is_a_named_option():
    domains = json.loads((SHARED_DATA / "clinc150" / "domains.json").read_text())
    splits = load_dataset(RunConfig(dataset="clinc150", data_dir=str(SHARED_DATA), num_tasks=5, class_order="domains"))
    grouped = [intent for intents in domains.values() for intent in intents]
    assert splits.class_names == grouped
    first_two = set(list(domains.values())[0]) | set(list(domains.values())[1])
    assert set(splits.class_names[:30]) == first_two


def test_class_order_alphabetical_renumbers_any_dataset_and_domains_is_clinc150s(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\nhi,zeta\nbye,alpha\nyo,mid\nok,alpha\n")
    (tmp_path / "test.csv").write_text("text,label\nhey,mid\nso,zeta\n")
    files = {"train_file": "train.csv", "test_file": "test.csv"}
    natural = load_dataset(config(tmp_path, "textfile", extra=files))
    assert natural.class_names == ["zeta", "alpha", "mid"] and natural.train_y.tolist() == [0, 1, 2, 1]
    alpha = load_dataset(config(tmp_path, "textfile", extra=files, class_order="alphabetical"))
    assert alpha.class_names == ["alpha", "mid", "zeta"]
    assert alpha.train_y.tolist() == [2, 0, 1, 0] and alpha.test_y.tolist() == [1, 2]
    assert alpha.train_x == natural.train_x
    with pytest.raises(ValueError, match="'domains' is CLINC150's"):
        load_dataset(config(tmp_path, "textfile", extra=files, class_order="domains"))
    with pytest.raises(ValueError, match="class_order must be one of"):
        RunConfig(class_order="random")


def test_spreadsheet_csv_with_a_byte_order_mark_semicolons_and_an_intent_column(tmp_path):
    text = "text;intent\nbook a table;restaurant\nwake me at 7;alarm\nany table free?;restaurant\n"
    (tmp_path / "train.csv").write_bytes(text.encode("utf-8-sig"))  # as spreadsheets save it
    (tmp_path / "test.tsv").write_text("text\tcategory\nset an alarm\talarm\n")
    (tmp_path / "test.jsonl").write_bytes('{"text": "table for two", "label": "restaurant"}\n'.encode("utf-8-sig"))
    for test_file in ("test.tsv", "test.jsonl"):
        splits = load_dataset(
            config(tmp_path, "textfile", settings={"data": {"train_file": "train.csv", "test_file": test_file}})
        )
        assert splits.class_names == ["restaurant", "alarm"] and splits.train_y.tolist() == [0, 1, 0]
        assert splits.train_x[0] == "book a table" and len(splits.test_x) == 1
    (tmp_path / "named.csv").write_text("text,topic,label\nhi,greeting,x\nbye,farewell,y\n")
    chosen = load_dataset(
        config(
            tmp_path,
            "textfile",
            settings={"data": {"train_file": "named.csv", "test_file": "named.csv", "label_column": "topic"}},
        )
    )
    assert chosen.class_names == ["greeting", "farewell"]
    (tmp_path / "nolabel.csv").write_text("text,tag\nhi,x\n")
    with pytest.raises(ValueError, match=r"no label column: expected one of \['label', 'intent', 'category'\]"):
        load_dataset(
            config(tmp_path, "textfile", settings={"data": {"train_file": "nolabel.csv", "test_file": "nolabel.csv"}})
        )


def test_relative_files_resolve_against_the_working_directory_and_errors_name_every_place_tried(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "t.csv").write_text("text,label\nhi,a\nbye,b\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LORM_DATA_DIR", raising=False)
    files = {"data": {"train_file": "mine/t.csv", "test_file": "mine/t.csv"}}
    cfg = RunConfig(dataset="textfile", num_tasks=1, settings=files)  # no data_dir: the working directory
    assert load_dataset(cfg).class_names == ["a", "b"]
    missing = RunConfig(
        dataset="textfile", num_tasks=1, settings={"data": {"train_file": "nope.csv", "test_file": "mine/t.csv"}}
    )
    with pytest.raises(FileNotFoundError) as err:
        load_dataset(missing)
    assert str(tmp_path / "nope.csv") in str(err.value) and "set data_dir or LORM_DATA_DIR" in str(err.value)
    monkeypatch.setenv("LORM_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match=r"tried .*nope\.csv and .*data/nope\.csv"):
        load_dataset(missing)


def test_truncation_is_warned_once_with_the_share_cut_and_a_length_that_fits(tmp_path, caplog):
    rows = [f"{' '.join(['w'] * n)},c{n % 2}" for n in (2, 3, 3, 9, 12)]  # 3..13 tokens with the start token
    (tmp_path / "t.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    files = {"data": {"train_file": "t.csv", "test_file": "t.csv"}}
    with caplog.at_level("WARNING", logger="lorm.client"):
        build_runtime(config(tmp_path, "textfile", backbone="tiny-bert", max_length=8, settings=files))
    warnings = [r.getMessage() for r in caplog.records if "max_length" in r.getMessage()]
    assert len(warnings) == 1
    assert "max_length 8 cuts 40.0 % of the training samples" in warnings[0] and "the longest 13" in warnings[0]
    assert "99th percentile is 13 tokens" in warnings[0]
    assert "--set max_length=13 keeps 99 % of them whole" in warnings[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="lorm.client"):
        build_runtime(config(tmp_path, "textfile", backbone="tiny-bert", max_length=16, settings=files))
    assert not [r for r in caplog.records if "max_length" in r.getMessage()]


def test_a_site_cut_by_the_coordinators_max_length_is_told_to_report_its_number_not_a_flag_it_lacks(caplog):
    """A site's own data: max_length is the coordinator's, and lorm-client takes no --set; the warning says who
    chooses it and which command counts the site's number."""
    from client.classifier import build_model
    from client.runtime import warn_truncation

    model = build_model(RunConfig(dataset="textfile", backbone="tiny-bert", max_length=4), 2)
    texts = ["w " * n for n in (2, 3, 9, 12)]
    with caplog.at_level("WARNING", logger="lorm.client"):
        assert warn_truncation(model, texts, 4, owned=True) == 0.5
        assert warn_truncation(model, texts, 4) == 0.5
    own, shared = (r.getMessage() for r in caplog.records)
    assert "the coordinator sets it for every site" in own and "lorm-sim --count-tokens FILE" in own
    assert "--set max_length" not in own and "--set max_length=13 keeps 99 % of them whole" in shared


def test_own_data_on_a_random_init_backbone_is_warned_with_the_preset_to_use(caplog):
    from client.runtime import warn_random_backbone

    with caplog.at_level("WARNING", logger="lorm.client"):
        assert warn_random_backbone(RunConfig(dataset="textfile", backbone="tiny-bert"))
        assert not warn_random_backbone(RunConfig(dataset="textfile", backbone="minilm"))
        assert not warn_random_backbone(RunConfig(dataset="synthetic-text", backbone="tiny-bert"))
        assert warn_random_backbone(RunConfig(dataset="imagefolder", backbone="tiny-vit"))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "random-init" in messages[0] and "--preset text" in messages[0]
    assert "--preset images" in messages[1]


def test_the_own_data_presets_name_pretrained_backbones_and_leave_tasks_to_the_data():
    from common.run.presets import preset

    for name, dataset, backbone in (("text", "textfile", "minilm"), ("images", "imagefolder", "vit-b16-in21k")):
        config = RunConfig.from_dict(preset(name))
        assert (config.dataset, config.backbone, config.num_tasks) == (dataset, backbone, 0)


def test_max_length_zero_keeps_what_99_percent_of_the_training_samples_need(tmp_path, caplog):
    """Sentences of 3..40 words on the word-level test tokenizer (a start token + one per word)."""
    train = tmp_path / "train.csv"
    rows = [("w " * (3 + i % 38)).strip() + f",c{i % 2}" for i in range(200)]
    train.write_text("text,label\n" + "\n".join(rows) + "\n")
    config = RunConfig(
        dataset="textfile",
        backbone="tiny-bert",
        max_length=0,
        num_tasks=1,
        settings={"data": {"train_file": str(train), "test_file": str(train)}},
    )
    with caplog.at_level("INFO", logger="lorm.client"):
        runtime = build_runtime(config)
    lengths = sorted(1 + 3 + i % 38 for i in range(200))
    p99 = int(np.ceil(np.percentile(lengths, 99)))
    assert runtime.config.max_length == -(-p99 // 8) * 8 == 48  # 41 tokens at the 99th percentile, up to 48
    assert runtime.train.inputs["input_ids"].shape[1] == 48
    assert any("max_length 0: 48 tokens" in r.getMessage() for r in caplog.records)
    assert runtime.spec.max_length == 48 and runtime.spec.classes == ("c0", "c1")  # what the client describes


def test_lorm_sim_says_what_is_wrong_with_the_data_without_a_traceback(tmp_path, capsys):
    from engine.simulation import main

    assert main(["--preset", "text", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lorm-sim: error: dataset 'textfile' needs the setting data.train_file")
    assert "Traceback" not in err
    missing = str(tmp_path / "nowhere.csv")
    assert main(["--preset", "text", "--no-progress", "--set", f"data.train_file={missing}"]) == 2
    assert "nowhere.csv" in capsys.readouterr().err  # the file it looked for


def test_validation_holds_out_every_kth_training_sample_per_class_instead_of_the_test_split():
    base = RunConfig(dataset="synthetic-text", settings={"data": {"synthetic_classes": 3, "synthetic_train": 10}})
    full = load_dataset(base)
    held = load_dataset(
        RunConfig(
            **{
                **json.loads(base.to_json()),
                "settings": {"data": {"synthetic_classes": 3, "synthetic_train": 10, "validation": 4}},
            }
        )
    )
    for c in range(3):
        train_c = [x for x, y in zip(full.train_x, full.train_y) if y == c]
        assert [x for x, y in zip(held.test_x, held.test_y) if y == c] == train_c[::4]  # 0th, 4th, 8th
        assert [x for x, y in zip(held.train_x, held.train_y) if y == c] == [x for i, x in enumerate(train_c) if i % 4]
    assert not set(held.test_x) & set(full.test_x) - set(full.train_x)  # no test sample is evaluated
    with pytest.raises(ValueError, match="validation=1"):
        validate(RunConfig(settings={"data": {"validation": 1}}))


@pytest.mark.parametrize("method", ["l2p", "coda-p", "target", "pilora"])
def test_the_vision_paths_of_the_new_competitors_train_end_to_end(tmp_path, method):
    """Prompts after a ViT's class token, TARGET's image generator, PILoRA's prototypes on ViT features:
    two tasks of tiny images, in-process."""
    settings = {
        "l2p": {"l2p": {"pool": 4, "top_k": 2, "length": 2}},
        "coda-p": {"coda": {"components": 4, "length": 2}},
        "target": {"target": {"rounds": 2, "steps": 2, "warmup": 1, "student_steps": 1, "batch": 4}},
        "pilora": {},
    }[method]
    cfg = tiny_vit_run(tmp_path, ["a", "b", "c", "d"], per_class=4, method=method, num_tasks=2, settings=settings)
    result = run_inprocess(cfg)
    assert len(result.matrix.accuracy()) == 2 and all(np.isfinite(h.get("loss", 0.0)) for h in result.history)
