from __future__ import annotations

import pytest

from farm.tools.editor import Editor


@pytest.fixture
def editor(tmp_path) -> Editor:
    return Editor(workspace=str(tmp_path))


def test_editor_create_and_view_with_line_numbers(editor: Editor, tmp_path) -> None:
    assert editor.run("create", "a/f.py", file_text="one\ntwo\nthree").ok
    assert (tmp_path / "a" / "f.py").read_text() == "one\ntwo\nthree"
    assert editor.run("view", "a/f.py").output == "1\tone\n2\ttwo\n3\tthree\n"


def test_editor_view_range_and_last_line(editor: Editor) -> None:
    editor.run("create", "f", file_text="\n".join(f"l{i}" for i in range(1, 13)))
    assert editor.run("view", "f", view_range=[11, -1]).output == "11\tl11\n12\tl12\n"
    assert editor.run("view", "f", view_range=[2, 3]).output == "2\tl2\n3\tl3\n"


def test_editor_view_range_out_of_file_is_an_error(editor: Editor) -> None:
    editor.run("create", "f", file_text="a\nb")
    result = editor.run("view", "f", view_range=[5, 9])
    assert result.exit_code == 1 and "outside" in (result.error or "")


def test_editor_view_directory_lists_files(editor: Editor, tmp_path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("")
    (tmp_path / "top.txt").write_text("")
    listing = editor.run("view", ".").output.split("\n")
    assert "pkg/m.py" in listing and "top.txt" in listing


def test_editor_str_replace_unique_match(editor: Editor, tmp_path) -> None:
    editor.run("create", "f", file_text="alpha\nbeta\ngamma\n")
    result = editor.run("str_replace", "f", old_str="beta", new_str="BETA")
    assert result.ok
    assert (tmp_path / "f").read_text() == "alpha\nBETA\ngamma\n"
    assert "2\tBETA" in result.output


def test_editor_str_replace_refuses_ambiguous_match(editor: Editor, tmp_path) -> None:
    editor.run("create", "f", file_text="x = 1\nx = 1\n")
    result = editor.run("str_replace", "f", old_str="x = 1", new_str="x = 2")
    assert result.exit_code == 1 and "2 times" in (result.error or "")
    assert (tmp_path / "f").read_text() == "x = 1\nx = 1\n"


def test_editor_str_replace_missing_text_is_an_error(editor: Editor) -> None:
    editor.run("create", "f", file_text="abc")
    result = editor.run("str_replace", "f", old_str="zzz", new_str="y")
    assert result.exit_code == 1 and "not found" in (result.error or "")


def test_editor_insert_after_line(editor: Editor, tmp_path) -> None:
    editor.run("create", "f", file_text="a\nc")
    assert editor.run("insert", "f", insert_line=1, new_str="b").ok
    assert (tmp_path / "f").read_text() == "a\nb\nc"
    assert editor.run("insert", "f", insert_line=0, new_str="top").ok
    assert (tmp_path / "f").read_text().startswith("top\na")


def test_editor_insert_out_of_range(editor: Editor) -> None:
    editor.run("create", "f", file_text="a")
    assert editor.run("insert", "f", insert_line=9, new_str="b").exit_code == 1


def test_editor_undo_restores_previous_content_then_creation(editor: Editor, tmp_path) -> None:
    editor.run("create", "f", file_text="v1")
    editor.run("str_replace", "f", old_str="v1", new_str="v2")
    assert editor.run("undo_edit", "f").ok
    assert (tmp_path / "f").read_text() == "v1"
    assert editor.run("undo_edit", "f").ok
    assert not (tmp_path / "f").exists()
    assert editor.run("undo_edit", "f").exit_code == 1


def test_editor_bad_requests_are_data(editor: Editor) -> None:
    assert "no such file" in (editor.run("view", "missing.txt").error or "")
    assert "unknown command" in (editor.run("delete", "f").error or "")
    assert "file_text is required" in (editor.run("create", "f").error or "")
    assert "old_str is required" in (editor.run("str_replace", "f").error or "")


def test_editor_refuses_devices_and_fifos_instead_of_reading_forever(editor: Editor, tmp_path) -> None:
    import os

    (tmp_path / "zero").symlink_to("/dev/zero")  # size 0 by stat, endless by read
    os.mkfifo(tmp_path / "fifo")  # would block a plain open
    for name in ("zero", "fifo"):
        for command in ("view", "str_replace"):
            result = editor.run(command, name, old_str="a", new_str="b")
            assert result.exit_code == 1 and "not a regular file" in (result.error or ""), (name, command)
