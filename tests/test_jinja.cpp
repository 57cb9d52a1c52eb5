// The Jinja subset (chat/jinja.h) and chat templates (chat/chat.h). The real models' templates
// are checked against the reference renderer in tests/templates; these pin each construct.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/chat.h"
#include "chat/jinja.h"
#include "core/error.h"

using namespace bmoe;
using jinja::JinjaError;
using jinja::Template;
using jinja::Value;

namespace {

std::string render(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  return Template(source).render(Value::from_json(context));
}

}  // namespace

TEST(Jinja, TextAndExpressions) {
  EXPECT_EQ(render("a{{ 1 + 2 * 3 }}b"), "a7b");
  EXPECT_EQ(render("{{ 'x' ~ 1 ~ undefined_name }}"), "x1");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }}"), "3 -4 1 3.5");
  EXPECT_EQ(render("{{ 1 if false else 2 }}{{ 3 if true }}{{ 4 if false }}"), "23");
  EXPECT_EQ(render("{{ not 1 == 2 and (1 < 2 or x) }}"), "true");
  EXPECT_EQ(render("{{ 'ab' in 'cabd' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'ab' }}"), "true true true true");
  EXPECT_EQ(render("{{ [1, 2] + [3] }} {{ {'a': [1, 'b']} }}"), "[1, 2, 3] {\"a\": [1, \"b\"]}");
  EXPECT_EQ(render("{{ true }} {{ none }} {{ undefined_name }} {{ 2.0 }}"), "true   2.0");
  EXPECT_EQ(render("{{ 'a' 'b' }}"), "ab");  // adjacent literals join
}

TEST(Jinja, WhitespaceControlAndBlockTrimming) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: its indentation goes.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("a\n{# note #}\nb"), "a\nb");
  EXPECT_EQ(render("keep\n"), "keep");  // one trailing newline of the template is dropped
  EXPECT_EQ(render("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
}

TEST(Jinja, LoopsAndScopes) {
  const auto ctx = nlohmann::ordered_json{{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index0 }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", ctx), "0a,1b,2c");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.revindex }}{{ loop.previtem or '-' }}{% endfor %}", ctx), "3-2a1b");
  EXPECT_EQ(render("{% for x in xs if x != 'b' %}{{ loop.length }}{% endfor %}", ctx), "22");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", ctx), "a");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{{ x }}{% endfor %}", ctx), "ac");
  // A set inside a loop stays in the loop; a namespace carries values out.
  EXPECT_EQ(render("{% set y = 0 %}{% for x in xs %}{% set y = 1 %}{% endfor %}{{ y }}", ctx), "0");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}", ctx), "3");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set block %}in{{ 1 }}{% endset %}[{{ block }}]"), "[in1]");
}

TEST(Jinja, Macros) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('a') }} {{ greet('b', punct='?') }}"), "hi a! hi b?");
  // A macro sees the template's globals, not its caller's loop variables.
  EXPECT_EQ(render("{% macro m() %}{{ g }}{{ x }}{% endmacro %}{% for x in [1] %}{{ m() }}{% endfor %}", {{"g", "G"}}), "G");
}

TEST(Jinja, FiltersTestsAndMethods) {
  EXPECT_EQ(render("{{ '  a b  ' | trim }}|{{ 'abc' | upper }}|{{ [3, 1] | length }}|{{ 'héllo' | length }}"), "a b|ABC|2|5");
  EXPECT_EQ(render("{{ x | default('d') }} {{ '' | default('e', true) }} {{ [1, 2] | join('-') }}"), "d e 1-2");
  EXPECT_EQ(render("{{ {'b': 1, 'A': 2} | dictsort }} {{ [1, 2] | first }}{{ [1, 2] | last }}"), "[[\"A\", 2], [\"b\", 1]] 12");
  EXPECT_EQ(render("{{ {'a': 'x\"\n'} | tojson }}"), "{\"a\": \"x\\\"\\n\"}");
  EXPECT_EQ(render("{{ [1] | tojson(indent=2) }}"), "[\n  1\n]");
  EXPECT_EQ(render("{{ ['a', 'code', 'b'] | reject('equalto', 'code') | join(',') }}"), "a,b");
  EXPECT_EQ(render("{{ [{'n': 'a'}, {'n': 'b'}] | map(attribute='n') | join }}"), "ab");
  EXPECT_EQ(render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ 3 is odd }} {{ 1 is not number }}"),
            "false true true true true false");
  EXPECT_EQ(render("{{ ' a b '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'xay'.lstrip('x') }}|{{ 'ab'.startswith(('z', 'a')) }}"),
            "a b|[\"a\", \"b\"]|ay|true");
  EXPECT_EQ(render("{{ {'k': 1}.get('k') }}{{ {'k': 1}.get('z', 'd') }}{{ 'a-b'.replace('-', '+') }}"), "1da+b");
  EXPECT_EQ(render("{{ 'abcd'[1:3] }}{{ 'abc'[::-1] }}{{ [1, 2, 3][-1] }}{{ [1, 2, 3][1:] }}"), "bccba3[2, 3]");
  EXPECT_EQ(render("{{ range(3) | list }} {{ range(1, 7, 3) | list }}"), "[0, 1, 2] [1, 4]");
}

// Each filter of the name table (filter_table in chat/jinja.cpp) under each of its names.
TEST(Jinja, EveryFilterAnswersToEachOfItsNames) {
  EXPECT_EQ(render("{{ 'ab' | d('x') }}|{{ [1, 2, 3] | count }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|"
                   "{{ 'AbC' | lower }}"),
            "ab|3|Hello World|Hello|abc");
  EXPECT_EQ(render("{{ (-3) | abs }}|{{ '42' | int }}|{{ 'x' | int(7) }}|{{ '2.5' | float }}|{{ [1, 2, 1] | unique }}"),
            "3|42|7|2.5|[1, 2]");
  EXPECT_EQ(render("{{ [{'a': 1}, {'a': 0}] | selectattr('a') | list | length }}|"
                   "{{ [{'a': 1}, {'a': 0}, {'a': 0}] | rejectattr('a') | list | length }}|"
                   "{{ [1, 2, 3, 4] | select('odd') | join }}|{{ {'k': 'v'} | items | list }}"),
            "1|2|13|[[\"k\", \"v\"]]");
  EXPECT_EQ(render("{{ [1, 2] | reverse | join }}|{{ 'ab' | reverse }}|{{ 'a\nb' | indent(2) }}|{{ 3 | string }}|"
                   "{{ 'x' | safe }}|{{ 'a-a' | replace('-', '+') }}|{{ ['x', 'y'] | map('upper') | join }}"),
            "21|ba|a\n  b|3|x|a+a|XY");
  try {
    render("{{ 1 | no_such_filter }}");
    FAIL() << "an unknown filter rendered";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown filter 'no_such_filter'"), std::string::npos) << e.what();
  }
}

TEST(Jinja, ErrorsAreOneLineJinjaErrors) {
  EXPECT_THROW(Template("{% if x %}never closed"), JinjaError);
  EXPECT_THROW(Template("{{ 1 + }}"), JinjaError);
  EXPECT_THROW(Template("{% frobnicate %}"), JinjaError);
  EXPECT_THROW(Template("{{ 'unclosed }}"), JinjaError);
  EXPECT_THROW(render("{{ 1 | no_such_filter }}"), JinjaError);
  EXPECT_THROW(render("{{ none + 1 }}"), JinjaError);
  EXPECT_THROW(render("{{ 'x' ~ none }}"), JinjaError);  // as the reference renderer
  EXPECT_THROW(render("{{ 1 // 0 }}"), JinjaError);
  try {
    render("line one\n{{ raise_exception('roles must alternate') }}");
    FAIL() << "raise_exception did not raise";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

TEST(Jinja, HostileTemplatesStopWithAnError) {
  EXPECT_THROW(Template("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), JinjaError);
  EXPECT_THROW(Template(std::string(3000, '[') + "{{ " + std::string(3000, '[') + " }}"), JinjaError);
  EXPECT_THROW(Template("{{ " + std::string(5000, '-') + "1 }}"), JinjaError);
  EXPECT_THROW(render("{% for a in range(1000000) %}{% for b in range(1000000) %}{% endfor %}{% endfor %}"), JinjaError);
  EXPECT_THROW(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), JinjaError);
  EXPECT_THROW(render("{{ range(100000000) | length }}"), JinjaError);
  EXPECT_THROW(render("{% set ns = namespace(s='xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx') %}"
                      "{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"), JinjaError);
}

TEST(ChatTemplate, ModelTemplateIsRenderedAndItsBosDropped) {
  const std::string tmpl = "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                           "{% if add_generation_prompt %}[assistant:{% if not enable_thinking %}quiet{% endif %}{% endif %}";
  std::string warning;
  const ChatTemplate t = ChatTemplate::for_model("", tmpl, "", "<s>", "</s>", true, &warning);
  EXPECT_TRUE(warning.empty());
  EXPECT_TRUE(t.is_jinja());
  EXPECT_EQ(t.apply({{"system", "s"}, {"user", "u"}}, false), "[system:s][user:u][assistant:");
  EXPECT_EQ(t.apply({{"user", "u"}}, true), "[user:u][assistant:quiet");
  const ChatTemplate keeps_bos = ChatTemplate::for_model("", tmpl, "", "<s>", "</s>", false, nullptr);
  EXPECT_EQ(keeps_bos.apply({{"user", "u"}}, false), "<s>[user:u][assistant:");
}

TEST(ChatTemplate, ContentPartsAndNullContentBecomeText) {
  const ChatTemplate t = ChatTemplate::for_model("", "{% for m in messages %}<{{ m.content }}>{% endfor %}", "", "", "", false, nullptr);
  ChatInputs in;
  in.messages = nlohmann::ordered_json::parse(
      R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}])");
  EXPECT_EQ(t.apply(in), "<ab><>");
}

TEST(ChatTemplate, FallsBackToTheBuiltinFormatWithAWarning) {
  std::string warning;
  const ChatTemplate broken = ChatTemplate::for_model("harmony", "{% if %}", "", "", "", false, &warning);
  EXPECT_FALSE(broken.is_jinja());
  EXPECT_EQ(broken.format(), ChatFormat::Harmony);
  EXPECT_NE(warning.find("harmony"), std::string::npos) << warning;
  warning.clear();
  const ChatTemplate none = ChatTemplate::for_model("", "", "", "", "", false, &warning);
  EXPECT_NE(warning.find("chatml"), std::string::npos) << warning;
  EXPECT_EQ(none.apply({{"user", "hi"}}, false), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChoiceByNameTextOrFile) {
  const ChatTemplate named = ChatTemplate::for_model("", "{{ 'model' }}", "llama3", "", "", false, nullptr);
  EXPECT_FALSE(named.is_jinja());
  EXPECT_EQ(named.format(), ChatFormat::Llama3);
  const ChatTemplate inline_text = ChatTemplate::for_model("", "", "{{ messages[0].content }}!", "", "", false, nullptr);
  EXPECT_EQ(inline_text.apply({{"user", "x"}}, false), "x!");
  EXPECT_THROW(ChatTemplate::for_model("", "", "no-such-format", "", "", false, nullptr), Error);
  EXPECT_THROW(ChatTemplate::for_model("", "", "{% if %}", "", "", false, nullptr), Error);
}
