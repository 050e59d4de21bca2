import json

import pytest

from animegamer.data.manifest import ClipRecord, ManifestError, meta_path, read_manifest, write_manifest

TAGS = "<S>Girl</S><MD>run</MD><EV>Forest</EV><ML>3</ML><MA>slowly</MA><SC>0</SC><ET>1</ET><ST>-1</ST>"


def test_round_trip(tmp_path):
    recs = [ClipRecord(f"f_{i}", f"clips/{i}.mp4", "f", i, 2.0 * i, 2.0 * i + 2, TAGS if i else None, 1.5, 3)
            for i in (1, 0)]
    path = write_manifest(tmp_path / "clips.jsonl", recs, meta={"motion_bins": [0.1, 0.2, 0.3, 0.4]})
    m = read_manifest(path)
    assert [r.clip_id for r in m.records] == ["f_1", "f_0"]
    assert [r.clip_index for r in m.films()["f"]] == [0, 1]
    assert m.meta["motion_bins"] == [0.1, 0.2, 0.3, 0.4] and meta_path(path).name == "clips.meta.json"
    assert m.video_path(m.records[0]) == tmp_path / "clips/1.mp4"
    assert m.records[0].shot_tags().values.motion_level == 3


@pytest.mark.parametrize(
    "line, needle",
    [
        ("{not json", "not valid JSON"),
        ('["a"]', "JSON object"),
        ('{"clip_id": "a", "video": "v", "film_id": "f", "clip_index": 0, "start": 0}', "missing field 'end'"),
        ('{"clip_id": "a", "video": "v", "film_id": "f", "clip_index": "0", "start": 0, "end": 2}', "clip_index"),
        ('{"clip_id": "a", "video": "v", "film_id": "f", "clip_index": 0, "start": 3, "end": 2}', "start < end"),
        ('{"clip_id": "a", "video": "v", "film_id": "f", "clip_index": 0, "start": 0, "end": 2, "x": 1}', "unknown"),
        ('{"clip_id": "a", "video": "v", "film_id": "f", "clip_index": 0, "start": 0, "end": 2, "motion_level": 9}',
         "motion_level"),
        ('{"clip_id": "a", "video": "v", "film_id": "f", "clip_index": 0, "start": 0, "end": 2, "tags": "<S>x</S>"}',
         "missing tag"),
    ],
)
def test_malformed_line_names_line_number(tmp_path, line, needle):
    good = json.dumps(ClipRecord("ok", "v.mp4", "f", 0, 0.0, 2.0).to_json())
    p = tmp_path / "m.jsonl"
    p.write_text(good + "\n\n" + line + "\n")
    with pytest.raises(ManifestError) as err:
        read_manifest(p)
    assert "m.jsonl:3" in str(err.value) and needle in str(err.value)


def test_duplicate_ids_and_missing_file(tmp_path):
    line = json.dumps(ClipRecord("a", "v.mp4", "f", 0, 0.0, 2.0).to_json())
    p = tmp_path / "m.jsonl"
    p.write_text(line + "\n" + line + "\n")
    with pytest.raises(ManifestError, match="duplicate clip_id 'a'"):
        read_manifest(p)
    with pytest.raises(ManifestError, match="not found"):
        read_manifest(tmp_path / "none.jsonl")


def test_sample_split_spreads_tagged_clips_of_the_split_films(tmp_path):
    tags = "<S>Qiqi</S><MD>run</MD><EV>park</EV><ML>3</ML><MA>quickly</MA><SC>0</SC><ET>0</ET><ST>-1</ST>"
    records = [
        ClipRecord(f"{film}_{i:05d}", f"{film}/{i}.mp4", film, i, 2.0 * i, 2.0 * i + 2, tags=tags if i != 3 else None)
        for film in ("a", "b") for i in range(6)
    ]
    write_manifest(tmp_path / "clips.jsonl", records, {"splits": {"train": ["a"], "test": ["b"]}})
    manifest = read_manifest(tmp_path / "clips.jsonl")
    test = [r.clip_id for r in manifest.sample_split("test", 3)]
    assert test == ["b_00000", "b_00002", "b_00005"]  # first, middle, last of the 5 tagged ones (b_00003 has none)
    assert len(manifest.sample_split("train", 50)) == 5 and manifest.sample_split("train", 1)[0].clip_id == "a_00000"
    # more asked for than there are: every tagged clip once, in order (not the first few, repeated)
    assert [r.clip_id for r in manifest.sample_split("train", 50)] == [f"a_{i:05d}" for i in (0, 1, 2, 4, 5)]
    with pytest.raises(ValueError, match="'val' films"):
        manifest.sample_split("val", 2)


def test_split_clips_reads_and_samples_or_exits_with_one_line(tmp_path, capsys):
    from animegamer.eval.research import split_clips

    tags = "<S>Qiqi</S><MD>run</MD><EV>park</EV><ML>3</ML><MA>quickly</MA><SC>0</SC><ET>0</ET><ST>-1</ST>"
    records = [ClipRecord(f"a_{i:05d}", f"a/{i}.mp4", "a", i, 2.0 * i, 2.0 * i + 2, tags=tags) for i in range(4)]
    write_manifest(tmp_path / "clips.jsonl", records, {"splits": {"train": ["a"], "test": []}})
    manifest, picks = split_clips(str(tmp_path / "clips.jsonl"), "train", 2)
    assert len(manifest) == 4 and [r.clip_id for r in picks] == ["a_00000", "a_00003"]
    for path, split, message in (("clips.jsonl", "test", "no tagged clips in the 'test' films"),
                                 ("missing.jsonl", "train", "manifest not found")):
        with pytest.raises(SystemExit) as exc:
            split_clips(str(tmp_path / path), split, 2)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
